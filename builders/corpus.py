"""Document generators: the course corpus and a realistic customer-support corpus.

``course_document(i)`` reproduces the course rows exactly (the 4.5M-row
contract). ``support_documents(n, seed)`` builds a knowledge base that a
retrieval demo can actually be judged on: help-centre articles about returns,
refunds, shipping, billing, warranty, accounts and troubleshooting, assembled
from per-topic sentence templates plus concrete details (products, numbers of
days, fees, carriers). Generation is deterministic for a seed, every document
is distinct, and ``support_documents(n)`` is a prefix of ``support_documents(m)``
for n < m.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.docstore import Document

CATEGORIES = ("technical", "billing", "shipping", "general")


def course_document(i: int) -> Document:
    """Row ``i`` of the course corpus."""
    return Document(
        doc_id=i,
        title=f"Document {i}",
        content=(
            f"This is the content of document {i}. "
            f"It contains information about customer support issue {i % 100}."
        ),
        category=CATEGORIES[i % 4],
    )


# --------------------------------------------------------------------------
# Vocabulary shared by the support templates.

ELECTRONICS = (
    "laptop", "tablet", "smartwatch", "smartphone", "4K smart TV", "Bluetooth speaker",
    "digital camera", "gaming console", "wireless router", "e-reader", "fitness tracker",
    "robot vacuum", "portable charger", "smart thermostat", "computer monitor",
    "mechanical keyboard", "wireless headset", "soundbar", "camera drone", "inkjet printer",
)
HOUSEHOLD = (
    "coffee maker", "blender", "winter jacket", "hiking backpack", "office chair",
    "cookware set", "yoga mat", "table lamp", "carry-on suitcase", "kitchen knife set",
    "air purifier", "electric kettle", "stand mixer", "standing desk", "duvet cover",
)
ALL_PRODUCTS = ELECTRONICS + HOUSEHOLD

# Each key is drawn once per document so that all sentences of a document agree.
PARAMS: dict[str, tuple] = {
    "return_days": (14, 30, 45, 60, 90),
    "refund_days": ("3-5", "5-7", "5-10", "7-10"),
    "restock_fee": (10, 15, 20),
    "warranty_months": (12, 24),
    "ext_years": (2, 3, 4),
    "ext_price": ("$29.99", "$49.99", "$79.99", "$99.99"),
    "std_days": ("3-5", "4-6", "5-7", "5-8"),
    "exp_days": ("1-2", "2-3"),
    "intl_days": ("7-14", "10-15", "10-21"),
    "free_ship": (25, 35, 50, 75),
    "std_fee": ("$4.99", "$5.99", "$6.95"),
    "exp_fee": ("$9.99", "$14.99", "$19.99"),
    "carrier": ("UPS", "FedEx", "USPS", "DHL"),
    "cutoff": ("12 p.m.", "2 p.m.", "3 p.m."),
    "addr_hours": (1, 2, 4, 12),
    "claim_days": (3, 5, 7, 10),
    "repair_days": ("7-10", "10-14", "5-7"),
    "reset_minutes": (15, 30, 60),
    "lock_attempts": (5, 6, 10),
    "lock_minutes": (15, 30),
    "privacy_days": (30, 45),
    "plan": ("Basic", "Plus", "Premium"),
    "plan_price": ("$4.99", "$9.99", "$14.99", "$19.99"),
    "points": (2, 3, 5),
    "promo_pct": (10, 15, 20, 25),
    "gift_years": (3, 5),
    "price_days": (7, 14, 30),
    "hours": (
        "8 a.m. to 8 p.m. ET, Monday through Friday",
        "9 a.m. to 6 p.m. local time, seven days a week",
        "7 a.m. to 10 p.m. ET every day",
        "24 hours a day by chat and 9 a.m. to 5 p.m. by phone",
    ),
    "phone": ("1-800-555-0142", "1-800-555-0199", "1-888-555-0175", "1-877-555-0110"),
    "tracking": ("1Z999AA10123456784", "ABC123", "9400111899223100012345", "JD014600003826739485", "TBA304958271000"),
    "menu": ("Account > Orders", "My Account > Order History", "Orders in the app menu"),
}


@dataclass(frozen=True)
class Topic:
    key: str
    category: str
    products: tuple[str, ...]
    titles: tuple[str, ...]
    openers: tuple[str, ...]
    # One sentence is chosen from each slot; slots give the article its structure.
    slots: tuple[tuple[str, ...], ...]


def _topic(key, category, products, titles, openers, *slots) -> Topic:
    return Topic(key, category, products, tuple(titles), tuple(openers), tuple(tuple(s) for s in slots))


TOPICS: tuple[Topic, ...] = (
    # ---------------------------------------------------------------- general
    _topic(
        "return_defective", "general", ALL_PRODUCTS,
        ["How to return a defective product", "How to return a defective {product}",
         "Returning a damaged or faulty {product}", "What to do if your {product} arrived defective",
         "Defective {product}: return and replacement options"],
        ["If your {product} is defective or stops working shortly after delivery, you can return it for a free replacement or a full refund.",
         "Products that arrive damaged or defective, such as {a_product} that will not work out of the box, can be returned at no cost to you."],
        ["Defective items can be returned within {return_days} days of delivery, and we cover the return shipping with a prepaid {carrier} label.",
         "You have {return_days} days from the delivery date to report a defect, and no restocking fee applies to faulty products.",
         "Returns for defective merchandise are free: we email a prepaid {carrier} label and waive the usual {restock_fee}% restocking fee."],
        ["To start, go to {menu}, select the order, choose 'Return or replace', pick 'Item is defective' as the reason and describe the problem.",
         "Open {menu}, find the {product}, click 'Start a return', and upload a photo or short video that shows the fault.",
         "Start the return online from {menu}; choose whether you want a replacement or a refund before printing the label."],
        ["Pack the {product} with all accessories and manuals, ideally in its original box, and drop it off at any {carrier} location within 7 days.",
         "Keep the serial number visible and include every accessory, because missing parts can delay the inspection.",
         "Once the item is scanned by the carrier, replacements ship within 1-2 business days and refunds are issued to your original payment method within {refund_days} business days."],
    ),
    _topic(
        "return_policy", "general", ALL_PRODUCTS,
        ["Our return policy explained", "How to return an item", "Returning {a_product} you no longer want",
         "Return policy for {product} orders", "Can I return an opened {product}?"],
        ["Most items, including {a_product}, can be returned within {return_days} days of delivery if they are in new or like-new condition.",
         "Changed your mind? Unused items can be sent back within {return_days} days for a refund or store credit."],
        ["Opened items are accepted if they are complete and undamaged, but a {restock_fee}% restocking fee may apply to opened electronics.",
         "Items must include the original packaging, tags and accessories; final-sale and personalised items cannot be returned.",
         "Return shipping is free for members; otherwise a flat {std_fee} fee is deducted from your refund."],
        ["Request a return from {menu}, print the prepaid label, and drop the package at any {carrier} location.",
         "You can also return in store: bring the {product} and your order number and the refund is processed at the counter.",
         "Select the item in {menu}, choose a reason, and you will receive a return label and QR code by email within a few minutes."],
        ["Refunds are issued to the original payment method within {refund_days} business days after the return is inspected.",
         "Gift returns receive store credit instead of a refund to the purchaser's card.",
         "Holiday purchases made between November 1 and December 31 can be returned until January 31."],
    ),
    _topic(
        "exchanges", "general", ALL_PRODUCTS,
        ["How to exchange an item", "Exchanging {a_product} for a different model or color",
         "Can I exchange my {product}?", "Size and color exchanges"],
        ["You can exchange {a_product} for a different size, color or model within {return_days} days of delivery.",
         "Exchanges are the fastest way to get the right item: we ship the replacement as soon as your return is scanned."],
        ["Exchanges for the same item in a different color or size are free, including shipping both ways.",
         "If the new model costs more, you pay the difference; if it costs less, the difference is refunded within {refund_days} business days.",
         "For an instant exchange we place a temporary hold on your card, released once the original {product} reaches our warehouse."],
        ["Go to {menu}, choose 'Exchange item', select the new option and print the {carrier} label we email you.",
         "Start the exchange online or in any store; in store, the replacement is handed to you immediately if it is in stock.",
         "Choose the replacement during the return flow; if it is out of stock we offer a refund instead."],
        ["Send the original back within 14 days of requesting the exchange, or the hold is charged.",
         "Each order can be exchanged once; further changes are handled as a return and a new order.",
         "Exchanged items keep the original warranty and return window."],
    ),
    _topic(
        "order_cancellation", "general", ALL_PRODUCTS,
        ["How to cancel an order", "Can I cancel my {product} order?", "Cancelling an order after checkout",
         "Order cancellation policy"],
        ["You can cancel an order, for example {a_product}, as long as it has not entered the packing stage.",
         "Orders can usually be cancelled within {addr_hours} hours of being placed."],
        ["To cancel, open {menu}, select the order and click 'Cancel items'; you receive a confirmation email right away.",
         "If the button is greyed out, the order is already being packed and can no longer be cancelled online.",
         "Cancelling part of an order is possible: select only the items you want to remove."],
        ["Pre-authorisations on your card are released within {refund_days} business days, depending on your bank.",
         "Payments made with a gift card are returned to the gift card balance immediately.",
         "If you paid with PayPal, the refund appears in your PayPal account within 24 hours."],
        ["If it has already shipped, refuse the delivery or return it within {return_days} days for a full refund.",
         "For shipped orders, start a standard return once the {product} arrives; return shipping is free for cancelled orders.",
         "Pre-orders can be cancelled at any time before they ship without any fee."],
    ),
    _topic(
        "contact_support", "general", ALL_PRODUCTS,
        ["How to contact customer support", "Customer service hours and contact options",
         "Getting help with your {product} order", "Talk to a support agent"],
        ["Our customer support team is available {hours}.",
         "You can reach a support agent by phone, live chat or email if you need help with an order such as {a_product}."],
        ["Call {phone} for urgent issues such as a missing delivery or an incorrect charge.",
         "Live chat is the fastest option: open the Help Center and click 'Chat with us'; average wait times are under 3 minutes.",
         "Email requests receive a reply within 24 hours, including on weekends."],
        ["Have your order number and the email address on your account ready so the agent can verify your identity.",
         "For faster help, include photos of the {product} if your question is about damage or a defect.",
         "Each conversation gets a case number, so you can follow up without repeating your details."],
        ["Many questions, such as returns, tracking and invoices, can be answered instantly in the Help Center.",
         "Support is available in English, Spanish and French.",
         "We never ask for your full card number or password over chat or phone."],
    ),
    _topic(
        "loyalty_program", "general", ALL_PRODUCTS,
        ["How the rewards program works", "Earning and redeeming reward points",
         "Do I earn points on {a_product}?", "Rewards membership benefits"],
        ["Rewards members earn {points} points for every dollar spent, including on purchases like {a_product}.",
         "Joining the rewards program is free and gives you points, early access to sales and free returns."],
        ["Every 100 points can be redeemed for $5 off a future order at checkout.",
         "Points are added to your account once the order ships and expire after 12 months without activity.",
         "Members get free standard shipping on all orders, with no minimum."],
        ["Returned items deduct the points earned on them from your balance.",
         "Points cannot be earned on gift card purchases or taxes and shipping fees.",
         "You can see your balance and history under Account > Rewards."],
        ["Upgrade to {plan} membership to earn double points and get free express shipping.",
         "Birthday rewards are added automatically if your date of birth is saved in your profile.",
         "Points are not transferable between accounts and have no cash value."],
    ),
    _topic(
        "account_management", "general", ALL_PRODUCTS,
        ["How to create an account", "Managing your account settings", "How to close or delete your account",
         "Updating your email address and profile"],
        ["Your account lets you track orders, save addresses and manage returns, for example for a recent {product}.",
         "You can update your profile, email address and communication preferences at any time."],
        ["To create an account, click 'Sign in', choose 'Create account' and confirm your email address with the code we send.",
         "To change your email, go to Account > Profile, enter the new address and confirm it from the verification email.",
         "Guest orders can be linked to a new account that uses the same email address."],
        ["Marketing emails can be switched off under Account > Communication preferences; order updates are always sent.",
         "You can save up to 10 shipping addresses and choose a default one for faster checkout.",
         "Closing your account is permanent: open orders must be completed and unused reward points are lost."],
        ["Account deletion requests are completed within {privacy_days} days, as required by privacy law.",
         "If you no longer have access to your email address, contact support at {phone} to verify your identity.",
         "Business customers can add colleagues to a shared account with separate logins."],
    ),
    _topic(
        "privacy", "general", ALL_PRODUCTS,
        ["Privacy policy and your personal data", "How to request a copy of your data",
         "How we protect your payment and personal information", "Deleting your personal data"],
        ["We collect only the data needed to process orders, deliver items and provide support.",
         "You can request a copy of your personal data or ask us to delete it at any time."],
        ["Data requests can be submitted under Account > Privacy and are completed within {privacy_days} days.",
         "We never sell personal information, and card details are handled by a PCI-DSS certified payment processor.",
         "Order records are kept for seven years for tax purposes, even after account deletion."],
        ["You can opt out of personalised recommendations and advertising cookies from the cookie settings link in the footer.",
         "Delivery partners such as {carrier} receive only your name, address and phone number.",
         "All data is encrypted in transit with TLS and at rest."],
        ["Questions about privacy can be sent to our data protection officer through the Help Center.",
         "If you suspect your account was accessed without permission, reset your password and contact us at {phone}.",
         "California and EU residents have additional rights described in the full privacy notice."],
    ),
    # ---------------------------------------------------------------- billing
    _topic(
        "refund_policy", "billing", ALL_PRODUCTS,
        ["What is our refund policy?", "Refund policy", "Refund policy for {product} purchases",
         "How refunds work", "When will I get my money back?"],
        ["Our refund policy lets you return most items within {return_days} days of delivery for a full refund to your original payment method.",
         "Refunds are issued for returned items, cancelled orders and products that arrive damaged or defective, including {a_product}."],
        ["Once we receive and inspect the return, the refund is processed within 2 business days and appears on your statement within {refund_days} business days.",
         "Refunds go back to the original payment method; gift card payments are refunded as store credit.",
         "Original shipping charges are refunded only when the item was defective or we sent the wrong product."],
        ["Opened electronics may be subject to a {restock_fee}% restocking fee unless they are defective.",
         "Partial refunds apply to items returned without accessories or with signs of use.",
         "If an item's price drops within {price_days} days of purchase, we refund the difference on request."],
        ["You can check the status of a refund in {menu}, where each return shows 'Received', 'Inspected' and 'Refunded'.",
         "If your refund has not arrived after {refund_days} business days, contact your bank first and then our support team at {phone}.",
         "Refunds for orders paid with buy-now-pay-later plans reduce your remaining instalments."],
    ),
    _topic(
        "refund_status", "billing", ALL_PRODUCTS,
        ["Where is my refund?", "Checking the status of a refund", "Refund for my {product} has not arrived",
         "Why is my refund taking so long?"],
        ["Refunds are processed once the returned {product} is scanned at our warehouse and inspected, usually within 2 business days.",
         "If you returned an item and have not seen your money yet, the refund may still be with your bank."],
        ["Card refunds take {refund_days} business days to appear after we process them; PayPal refunds usually appear within 24 hours.",
         "Debit card refunds can take longer than credit card refunds because some banks hold the funds.",
         "You receive an email with a refund reference number as soon as we issue the refund."],
        ["Check {menu}: the return shows 'Refunded' with the date and amount once it is complete.",
         "If the return shipment is still in transit, you can follow it with the {carrier} tracking number on your return label.",
         "Refunds for returns dropped off in store are issued at the counter and reach your card within {refund_days} business days."],
        ["If more than {refund_days} business days have passed, give your bank the refund reference number from our email.",
         "Still missing? Contact support at {phone}; we can trace the payment and resend it if needed.",
         "Refunds are always made in the original currency, so exchange rates may cause small differences."],
    ),
    _topic(
        "update_billing", "billing", ALL_PRODUCTS,
        ["How do I update my billing information?", "How to update your billing address and payment card",
         "Changing the credit card on your account", "Updating billing details for {a_product} order",
         "Updating an expired card"],
        ["You can update your billing information, including your billing address and saved payment cards, at any time in your account.",
         "Keeping your billing details current avoids declined payments on new orders and subscription renewals."],
        ["Go to Account > Payment methods, click 'Edit' next to the card, and enter the new expiry date or billing address.",
         "To add a new card, choose 'Add payment method', enter the card details and set it as default for future orders.",
         "Your billing address must match the address your bank has on file, or the payment may be declined."],
        ["Changes apply to new orders and the next subscription renewal; an order that has already shipped keeps the original card.",
         "For an open order, such as {a_product} that has not shipped yet, you can change the payment method from {menu} until it is packed.",
         "If a payment fails, we retry the card after 24 hours and email you a link to update your billing information."],
        ["For security, card details are never shown in full, and we may ask you to confirm the change with a one-time code.",
         "Company customers can update the billing address printed on invoices under Account > Business details.",
         "If you cannot edit a card, remove it and add it again, or contact support at {phone}."],
    ),
    _topic(
        "payment_methods", "billing", ALL_PRODUCTS,
        ["What payment methods do you accept?", "Accepted payment methods", "Ways to pay for your {product}",
         "Paying with PayPal, Apple Pay or a gift card", "Buy now, pay later options"],
        ["We accept all major credit and debit cards, including Visa, Mastercard, American Express and Discover, as well as PayPal, Apple Pay and Google Pay.",
         "You can pay for your order, for example {a_product}, with a credit or debit card, PayPal, Apple Pay, Google Pay or a gift card."],
        ["Buy now, pay later is available on orders over $50 through Klarna or Affirm, splitting the total into four interest-free payments.",
         "Gift cards can be combined with a card or PayPal to pay any remaining balance.",
         "Business customers can pay by invoice with 30-day terms after a quick credit check."],
        ["We do not accept cash on delivery, personal cheques or cryptocurrency.",
         "Prepaid cards are accepted if they are registered with a billing address.",
         "Payments in foreign currencies are converted by your card issuer, which may charge a fee."],
        ["Your card is authorised at checkout and charged only when the order ships.",
         "All payments are processed securely with 3-D Secure verification where your bank supports it.",
         "You can save several payment methods under Account > Payment methods and choose one at checkout."],
    ),
    _topic(
        "invoices", "billing", ALL_PRODUCTS,
        ["How to download an invoice or receipt", "Getting a VAT invoice for your order",
         "Invoice for my {product} purchase", "Requesting a corrected invoice"],
        ["An invoice is generated automatically for every order once it ships, including your {product}.",
         "You can download receipts and invoices as PDF files from your account."],
        ["Open {menu}, select the order and click 'Download invoice'.",
         "Invoices list each item, the tax charged, shipping costs and the payment method used.",
         "For orders shipped in several packages, each shipment has its own invoice."],
        ["Business customers can add a company name and VAT number under Account > Business details before ordering.",
         "To correct a name or address on an invoice, request a corrected invoice within 30 days of the order.",
         "Guest checkout orders receive the invoice by email; it can be resent from the Help Center."],
        ["Refunds and partial returns generate a credit note that appears next to the original invoice.",
         "Invoices are kept in your account for seven years.",
         "If an invoice is missing, contact support with your order number and we will send it within 1 business day."],
    ),
    _topic(
        "subscriptions", "billing", ALL_PRODUCTS,
        ["Managing your {plan} membership", "How to cancel a subscription", "Subscription renewal and billing",
         "Changing your membership plan"],
        ["The {plan} membership costs {plan_price} per month and renews automatically until you cancel.",
         "Your subscription renews on the same day each month, and the charge appears on your statement as a membership fee."],
        ["Cancel any time under Account > Membership; you keep the benefits until the end of the current billing period.",
         "Switching plans takes effect immediately, and the price difference is prorated on your next bill.",
         "Annual plans can be refunded in full within 14 days of renewal if no benefits have been used."],
        ["We email a reminder 7 days before an annual renewal.",
         "If a renewal payment fails, we retry for 3 days before pausing the membership.",
         "Membership includes free express shipping, extended returns of {return_days} days and member-only discounts."],
        ["To update the card used for renewals, go to Account > Payment methods.",
         "Paused memberships can be resumed at any time without a new sign-up fee.",
         "Questions about a membership charge can be answered by support at {phone}."],
    ),
    _topic(
        "duplicate_charge", "billing", ALL_PRODUCTS,
        ["I was charged twice for my order", "Unrecognised charge on my statement",
         "Why was my card charged for {a_product} I cancelled?", "Pending charges and authorisations"],
        ["A second charge is often a temporary authorisation rather than a real payment.",
         "If you see two charges for one order, such as {a_product}, check whether one of them is marked as pending."],
        ["Authorisation holds are released automatically within {refund_days} business days; only the final charge remains.",
         "When an order ships in several packages, each shipment is charged separately, which can look like duplicates.",
         "Changing the payment method on an open order creates a new authorisation while the old one is released."],
        ["Compare the amounts with the invoices in {menu} to see which shipment each charge belongs to.",
         "If both charges have posted, send us a screenshot of your statement and we refund the duplicate within 2 business days.",
         "Charges from our marketplace sellers appear under the seller's name on your statement."],
        ["If you do not recognise a charge at all, change your password and contact support at {phone}.",
         "Please contact us before disputing a charge with your bank; disputes take longer to resolve.",
         "Subscription renewals appear as a separate monthly charge of {plan_price}."],
    ),
    _topic(
        "gift_cards", "billing", ALL_PRODUCTS,
        ["How to use a gift card", "Checking your gift card balance", "Buying a gift card",
         "Gift card not working at checkout"],
        ["Gift cards can be used for any purchase on our website, in the app or in store, including {a_product}.",
         "Digital gift cards are delivered by email within minutes and physical cards ship free."],
        ["Enter the 16-digit code and PIN in the 'Gift card' field at checkout; the balance is applied before your other payment method.",
         "Check your balance under Account > Gift cards or on the gift card page with the card number and PIN.",
         "Up to five gift cards can be combined on one order."],
        ["Gift cards do not expire and carry no fees.",
         "Promotional gift cards expire after {gift_years} years; the expiry date is printed in the email.",
         "Gift cards cannot be exchanged for cash except where required by law."],
        ["Lost cards can be replaced if you have the purchase receipt or order number.",
         "Refunds for orders paid with a gift card go back to the gift card balance.",
         "If a code is rejected, check for the letter O instead of zero, or contact support at {phone}."],
    ),
    _topic(
        "promo_codes", "billing", ALL_PRODUCTS,
        ["How to use a promo code", "Why is my discount code not working?", "Current promotions and sales",
         "Discount on {a_product}"],
        ["Promo codes are entered in the 'Discount code' field at checkout and applied before tax.",
         "Seasonal promotions offer up to {promo_pct}% off selected items, such as {a_product}."],
        ["Only one promo code can be used per order, but codes can be combined with gift cards and reward points.",
         "Codes are case-insensitive and usually valid for 14 days; the expiry date is in the email you received.",
         "Some codes require a minimum order value or apply only to specific brands or categories."],
        ["If a code is not accepted, check that your cart meets the minimum and that the items are eligible.",
         "Discounts are shared across items, so a partial return refunds the amount actually paid for that item.",
         "A code cannot be added to an order after checkout, but support can apply a price adjustment within {price_days} days."],
        ["Sign up for emails to get {promo_pct}% off your first order.",
         "Student and military discounts are verified once and then applied automatically.",
         "Promotional prices are valid while supplies last."],
    ),
    _topic(
        "price_adjustment", "billing", ALL_PRODUCTS,
        ["Price match and price adjustment policy", "The price dropped after I ordered",
         "Do you price match on {a_product}?", "Requesting a price adjustment"],
        ["If the price of an item you bought drops within {price_days} days, we refund the difference.",
         "We match the price of major retailers on identical items in stock, including {a_product}."],
        ["Request an adjustment from {menu} by selecting the item and choosing 'Price adjustment'.",
         "For a price match, send a link to the competitor's offer; the item must be the same model and color.",
         "The difference is refunded to your original payment method within {refund_days} business days."],
        ["Price adjustments do not apply to flash sales, clearance items or marketplace sellers.",
         "Each item can be adjusted once, and only for the same size or configuration you bought.",
         "Membership discounts and coupons are taken into account when calculating the difference."],
        ["Price matches are not available on auction sites or prices that require a membership elsewhere.",
         "If you already returned the item, a price adjustment is no longer possible.",
         "Contact support at {phone} if the button is not available for your order."],
    ),
    # ---------------------------------------------------------------- shipping
    _topic(
        "shipping_times", "shipping", ALL_PRODUCTS,
        ["How long does shipping take?", "Delivery times and shipping options", "Shipping times for {a_product}",
         "Standard vs. express delivery", "When will my order arrive?"],
        ["Shipping typically takes {std_days} business days with standard delivery and {exp_days} business days with express delivery.",
         "How long shipping takes depends on the option you choose: standard delivery typically takes {std_days} business days and express delivery {exp_days} business days.",
         "Most orders, such as {a_product}, ship within 1 business day and arrive in {std_days} business days with standard shipping."],
        ["Orders placed before {cutoff} on a business day leave our warehouse the same day.",
         "Standard shipping costs {std_fee} and is free on orders over ${free_ship}; express shipping costs {exp_fee}.",
         "We ship with {carrier} and other regional carriers, depending on your address."],
        ["Large items such as furniture are delivered by freight within 7-10 business days, with a scheduled delivery window.",
         "Delivery to Alaska, Hawaii and PO boxes can take 2-3 extra business days.",
         "During holidays and major sales, allow 1-2 extra business days for processing."],
        ["The estimated delivery date is shown at checkout and in your order confirmation email.",
         "International orders arrive in {intl_days} business days, depending on customs clearance.",
         "You receive a tracking number by email as soon as the order ships."],
    ),
    _topic(
        "tracking", "shipping", ALL_PRODUCTS,
        ["How to track your order", "Tracking {a_product} shipment", "Where is my tracking number?",
         "Understanding tracking statuses"],
        ["As soon as your order ships, we email you a tracking number and a link to follow the package.",
         "You can follow every shipment, including your {product}, from {menu} or on the carrier's website."],
        ["Tracking numbers look like {tracking} and can be entered on the {carrier} website or in our app.",
         "Tracking updates can take up to 24 hours to appear after you receive the shipping email.",
         "Orders shipped in several packages have one tracking number per package."],
        ["'Label created' means the package is packed and waiting for the carrier to pick it up.",
         "'In transit' means the package is moving between carrier facilities; it may not update for a day or two.",
         "'Out for delivery' means the package is on the delivery vehicle and should arrive by 8 p.m. today."],
        ["Sign up for text alerts in the tracking page to get a message on the delivery day.",
         "If tracking shows no movement for {claim_days} business days, contact us and we will open an investigation with {carrier}.",
         "You can ask {carrier} to hold the package at a nearby pickup point from the tracking page."],
    ),
    _topic(
        "order_not_arrived", "shipping", ALL_PRODUCTS,
        ["My order hasn't arrived yet", "What to do if your order is late", "My {product} has not been delivered",
         "Order delayed: tracking number not updating", "Late delivery help"],
        ["If your order hasn't arrived yet, first check the tracking number in your shipping confirmation email, for example {tracking}.",
         "Orders sometimes arrive later than the estimated date, especially when the carrier is busy or the weather is bad."],
        ["Enter the tracking number on the {carrier} website or in {menu} to see the latest scan and the updated delivery estimate.",
         "If the tracking number has not updated for more than {claim_days} business days, the package may be delayed at a sorting facility.",
         "Tracking that shows 'Label created' only means the carrier has not scanned the package yet; this usually resolves within 2 business days."],
        ["Check that the shipping address in your order is complete, including apartment or suite number.",
         "Standard shipping takes {std_days} business days, so an order is considered late only after that window has passed.",
         "If the package was left with a neighbour or at a pickup point, the carrier usually leaves a note."],
        ["If your {product} is more than {claim_days} business days late, contact us with your order number and tracking number and we will send a replacement or refund.",
         "Our support team at {phone} can open a trace with {carrier} and give you an update within 48 hours.",
         "For late express orders we refund the {exp_fee} express shipping fee."],
    ),
    _topic(
        "lost_package", "shipping", ALL_PRODUCTS,
        ["Package marked as delivered but not received", "Lost or stolen package", "My {product} package is missing",
         "What to do if your package is lost"],
        ["If tracking says your package was delivered but you cannot find it, do not worry: most missing packages turn up within 48 hours.",
         "Packages that are lost in transit or stolen after delivery, such as {a_product}, are replaced or refunded after a short investigation."],
        ["Check around your property, with neighbours and at your building's mail room, and look for a delivery photo in the {carrier} tracking page.",
         "Sometimes carriers mark a package as delivered a day early; wait one business day before reporting it.",
         "Confirm the shipping address on the order; a wrong address is the most common cause of missing packages."],
        ["If it is still missing, report it from {menu} within {claim_days} days of the delivery date.",
         "We open a claim with {carrier}; investigations take up to 5 business days.",
         "For high-value items, the carrier may ask you to sign a short statement confirming non-receipt."],
        ["Once the claim is approved, we ship a replacement for free or issue a refund within {refund_days} business days.",
         "To avoid future losses, ship to a pickup point or request signature on delivery.",
         "If the package shows up later, contact us so we can arrange a return of the extra item."],
    ),
    _topic(
        "change_address", "shipping", ALL_PRODUCTS,
        ["Can I change my shipping address after placing an order?", "How to change your delivery address",
         "Changing the shipping address on {a_product} order", "Wrong shipping address on my order",
         "Redirecting a package to a new address"],
        ["You can change the shipping address after placing an order as long as the order has not shipped yet.",
         "Entered the wrong address? The shipping address can usually be updated within {addr_hours} hours of placing the order."],
        ["Go to {menu}, select the order and click 'Change address'; the option disappears once the order is packed.",
         "If the option is not available, contact support immediately at {phone}; we can often update it before the carrier picks it up.",
         "Address changes are limited to the same country, and the new address must pass our delivery check."],
        ["Once an order has shipped, you can request a redirect with {carrier} from the tracking page, which may cost a small fee.",
         "Shipped orders that cannot be redirected are returned to us after the delivery attempt and refunded automatically.",
         "For a shipped {product}, you can also ask the carrier to hold it at a nearby pickup point."],
        ["Changing the address may update the delivery estimate and shipping cost.",
         "To avoid mistakes, save your addresses in Account > Addresses and pick one at checkout.",
         "For security, address changes on high-value orders may require confirmation by email."],
    ),
    _topic(
        "international_shipping", "shipping", ALL_PRODUCTS,
        ["Do you ship internationally?", "International shipping, customs and duties",
         "Shipping {a_product} abroad", "Customs fees on international orders"],
        ["We ship to more than 40 countries, and international orders arrive in {intl_days} business days.",
         "International delivery is available for most products, including {a_product}, with full tracking."],
        ["Duties and import taxes are calculated at checkout, so there are no surprise fees on delivery.",
         "International orders ship with {carrier} and are cleared through customs by the carrier.",
         "Some electronics with lithium batteries cannot be shipped to certain countries because of carrier rules."],
        ["Customs clearance can add 2-5 business days, especially during holidays.",
         "The recipient may be asked for an ID number or phone number to clear customs.",
         "International shipping is free on orders over $150; otherwise rates start at $19.99."],
        ["International returns are accepted within {return_days} days, but return shipping is paid by the customer.",
         "Warranty service outside the country of purchase may be limited; check the manufacturer's terms.",
         "Track your international package with {tracking}-style numbers on the {carrier} website."],
    ),
    _topic(
        "shipping_costs", "shipping", ALL_PRODUCTS,
        ["How much does shipping cost?", "Free shipping threshold", "Express and next-day delivery options",
         "Shipping fees for {a_product}"],
        ["Standard shipping costs {std_fee} and is free on orders over ${free_ship}.",
         "Shipping costs depend on the delivery speed you choose and the size of the item, such as {a_product}."],
        ["Express delivery in {exp_days} business days costs {exp_fee}; next-day delivery is available in most cities for orders placed before {cutoff}.",
         "Members get free standard shipping on every order and discounted express delivery.",
         "Oversized items carry a freight fee that is shown on the product page."],
        ["Shipping fees are shown at checkout before you pay and on your order confirmation.",
         "If an order is split into several shipments, you only pay shipping once.",
         "Store pickup is always free and usually ready within 2 hours."],
        ["Shipping fees are refunded if we send the wrong item or it arrives damaged.",
         "Express fees are refunded automatically when an express order arrives late.",
         "Saturday delivery is available for an extra {std_fee} in selected areas."],
    ),
    _topic(
        "damaged_in_transit", "shipping", ALL_PRODUCTS,
        ["My package arrived damaged", "Item damaged during shipping", "What to do if your {product} arrives broken",
         "Reporting shipping damage"],
        ["If your {product} arrived damaged in shipping, we replace it or refund you at no cost.",
         "Packages that arrive crushed, wet or opened should be reported as soon as possible."],
        ["Take photos of the box, the packing material and the damaged item before you throw anything away.",
         "Report the damage from {menu} within {claim_days} days of delivery by choosing 'Item arrived damaged'.",
         "If the box is visibly damaged, you can also refuse the delivery and the carrier returns it to us."],
        ["We ship a replacement as soon as the report is approved, usually within 1 business day, without waiting for the return.",
         "A prepaid {carrier} label is provided to send the damaged item back within 30 days.",
         "For large items, we arrange a free pickup from your home."],
        ["If you prefer a refund, it is issued to your original payment method within {refund_days} business days.",
         "Minor cosmetic damage can be resolved with a partial refund if you decide to keep the item.",
         "Our support team at {phone} can help if the online form does not accept your report."],
    ),
    # ---------------------------------------------------------------- technical
    _topic(
        "warranty_electronics", "technical", ELECTRONICS,
        ["Is there a warranty on electronic items?", "Warranty coverage for electronics",
         "What does the warranty cover on {a_product}?", "How to make a warranty claim",
         "Extended warranty and protection plans"],
        ["All electronic items, including {a_product}, come with a {warranty_months}-month manufacturer's warranty that covers defects in materials and workmanship.",
         "Yes, electronics are covered by a warranty: {warranty_months} months from the date of delivery for manufacturing defects."],
        ["The warranty covers faults such as a battery that no longer charges, dead pixels, or buttons that stop responding, but not accidental damage or liquid spills.",
         "Within the first {return_days} days, a defective item is replaced directly by us; after that, warranty service is handled by the manufacturer or our repair center.",
         "Refurbished electronics carry a 12-month warranty, and open-box items keep the full manufacturer's warranty."],
        ["You can extend coverage with a {ext_years}-year protection plan for {ext_price}, which also covers accidental drops and spills.",
         "Protection plans can be added at checkout or up to 30 days after purchase under {menu}.",
         "Keep your invoice: it serves as proof of purchase for any warranty claim."],
        ["To make a claim, open {menu}, select the {product} and choose 'Warranty claim', then describe the fault and attach photos.",
         "Warranty repairs take {repair_days} business days, and shipping to and from the repair center is free.",
         "If a repair is not possible, we replace the item with the same or a comparable model."],
    ),
    _topic(
        "repairs", "technical", ELECTRONICS,
        ["How to get your {product} repaired", "Repair service for electronics", "Out-of-warranty repairs",
         "Checking the status of a repair"],
        ["Our repair center fixes most electronics, such as {a_product}, whether or not it is still under warranty.",
         "If your {product} needs a repair, you can book one online and send it to our repair center for free."],
        ["Book a repair from {menu} or the Help Center; you receive a prepaid {carrier} label and a repair number.",
         "Back up your data and remove passwords or locks before sending the device, as repairs may require a reset.",
         "Remove SIM cards, memory cards and cases before packing the device."],
        ["Repairs take {repair_days} business days from the day the device arrives at the repair center.",
         "Out-of-warranty repairs start with a free diagnosis, and we send you a quote before doing any work.",
         "Screen and battery replacements for common models are often completed within 3 business days."],
        ["Track the repair with your repair number in the Help Center; you get an email at each step.",
         "Repaired devices carry a 90-day warranty on the repaired part.",
         "If you decline the quote, the device is returned to you for free."],
    ),
    _topic(
        "password_reset", "technical", ALL_PRODUCTS,
        ["How to reset your password", "Forgot your password?", "Password reset email not received",
         "Changing your account password"],
        ["If you forgot your password, click 'Forgot password' on the sign-in page and enter your account email address.",
         "You can reset your password at any time from the sign-in page or change it in Account > Security."],
        ["We send a reset link that is valid for {reset_minutes} minutes; open it on the same device if possible.",
         "Passwords need at least 10 characters, including a number and a symbol, and cannot match your last five passwords.",
         "After a reset, you are signed out on all devices, including the mobile app."],
        ["If the email does not arrive within 5 minutes, check your spam or promotions folder and make sure you used the correct address.",
         "Reset links can only be used once; request a new one if it has expired.",
         "Corporate email filters sometimes block reset messages, so try adding our address to your contacts."],
        ["If you no longer have access to the email address, contact support at {phone} and we will verify your identity.",
         "For extra security, turn on two-step verification after resetting your password.",
         "We will never ask for your password by email, chat or phone."],
    ),
    _topic(
        "login_problems", "technical", ALL_PRODUCTS,
        ["I can't log in to my account", "Login problems and locked accounts", "Troubleshooting sign-in errors",
         "Account locked after too many attempts"],
        ["If you cannot sign in, make sure you are using the email address you registered with and that Caps Lock is off.",
         "Login problems are usually caused by a wrong password, an old saved password in the browser, or a locked account."],
        ["After {lock_attempts} failed attempts the account is locked for {lock_minutes} minutes to protect it.",
         "Clear your browser cookies and cache, or try a private window, if the sign-in page keeps reloading.",
         "Update the mobile app to the latest version; older versions may no longer be able to sign in."],
        ["If you signed up with Google or Apple, use the same button on the sign-in page instead of a password.",
         "Verification codes are valid for 10 minutes; request a new one if yours has expired.",
         "Check that your device's date and time are set automatically, since wrong clock settings can reject codes."],
        ["Still locked out? Reset your password or contact support at {phone}, available {hours}.",
         "If you suspect someone else accessed your account, reset your password and review recent orders.",
         "Business accounts can ask their administrator to unlock the user."],
    ),
    _topic(
        "troubleshoot_power", "technical", ELECTRONICS,
        ["{product} won't turn on", "Troubleshooting {a_product} that won't charge",
         "My {product} keeps shutting down", "Battery and charging problems"],
        ["If your {product} will not turn on or charge, a few simple checks solve most problems before a repair is needed.",
         "Power problems with {a_product} are usually caused by the charger, the cable or a drained battery."],
        ["Charge the device for at least 30 minutes with the original charger, then hold the power button for 15 seconds to force a restart.",
         "Try a different outlet and cable; damaged or low-power USB chargers are a common cause of charging issues.",
         "Check the charging port for dust or lint and clean it gently with a dry, soft brush."],
        ["If the device turns on but shuts down quickly, install the latest software update and turn off battery-heavy features.",
         "Batteries that drain within a few hours after {warranty_months} months may need a replacement, which is covered by the warranty if defective.",
         "Avoid charging in hot places; high temperatures make the device shut down to protect the battery."],
        ["If nothing works, start a warranty claim or return from {menu}; items within {return_days} days are replaced directly.",
         "Contact technical support at {phone} for a guided diagnosis before sending the {product} for repair.",
         "A factory reset can fix software faults, but back up your data first."],
    ),
    _topic(
        "troubleshoot_connectivity", "technical", ELECTRONICS,
        ["How to pair your {product} with Bluetooth", "{product} won't connect to Wi-Fi",
         "Fixing connection and pairing problems", "Troubleshooting {a_product} that keeps disconnecting"],
        ["Most connection problems with {a_product} can be fixed by restarting it and pairing it again.",
         "If your {product} will not connect to Wi-Fi or Bluetooth, follow these steps before contacting support."],
        ["Remove the device from your phone's Bluetooth list, restart both devices, and put the {product} back in pairing mode.",
         "For Wi-Fi, make sure you are on the 2.4 GHz network if the device does not support 5 GHz, and re-enter the password carefully.",
         "Move the device closer to the router or phone; walls and microwaves can interrupt the signal."],
        ["Update the firmware from the companion app; updates often improve connection stability.",
         "Turn off VPNs and battery-saver modes, which can block local connections.",
         "Restart your router and check whether other devices can connect to the network."],
        ["If the problem continues, reset the {product} to factory settings and set it up again.",
         "Technical support is available {hours} at {phone} and can walk you through the setup.",
         "If the device still cannot connect, it may be defective and can be returned within {return_days} days."],
    ),
    _topic(
        "app_issues", "technical", ALL_PRODUCTS,
        ["The app keeps crashing", "Checkout errors on the website", "Payment page not loading",
         "Troubleshooting the mobile app"],
        ["If the app crashes or the website shows an error at checkout, the problem is usually fixed by updating or clearing stored data.",
         "Technical problems with the app or website rarely affect your order, but they can stop you from completing checkout."],
        ["Update the app to the latest version from the App Store or Google Play, then restart your phone.",
         "On the website, clear cookies and cache or try another browser; ad blockers can stop the payment page from loading.",
         "If checkout fails, check that your billing address matches your card and that the card has not expired."],
        ["If the app crashes on start, uninstall and reinstall it; your account and orders are stored online.",
         "Error codes shown at checkout help support find the cause, so take a screenshot.",
         "Our status page shows any ongoing outages and the expected fix time."],
        ["Contact support at {phone} if an order was charged but does not appear in {menu}.",
         "Avoid placing the same order repeatedly after an error; check your email for a confirmation first.",
         "The app supports iOS 16 and Android 10 or newer."],
    ),
    _topic(
        "account_security", "technical", ALL_PRODUCTS,
        ["How to turn on two-step verification", "Keeping your account secure",
         "Suspicious activity on my account", "Phishing emails and scams"],
        ["Two-step verification adds a one-time code to your sign-in and is the best way to protect your account.",
         "We take account security seriously and recommend a few simple steps to keep your account safe."],
        ["Turn it on in Account > Security by choosing an authenticator app or text messages.",
         "Save the backup codes in a safe place; each can be used once if you lose your phone.",
         "You can see signed-in devices under Account > Security and sign out any you do not recognise."],
        ["We never ask for your password, full card number or verification codes by email, text or phone.",
         "Phishing emails often use urgent language and links that look similar to our website; forward them to our security team.",
         "If you notice an order you did not place, cancel it from {menu} and reset your password immediately."],
        ["Contact support at {phone} if you think your account was compromised; we can lock it while we investigate.",
         "Use a unique password that you do not use on other sites.",
         "Security alerts are sent by email whenever your password or email address changes."],
    ),
)

# Optional last sentence, chosen per category, that varies article length.
CLOSERS: dict[str, tuple[str, ...]] = {
    "general": (
        "Need more help? Our support team is available {hours}.",
        "You can also call us at {phone} if you prefer to speak to someone.",
        "This article applies to orders placed on our website and in our app.",
    ),
    "billing": (
        "Billing questions can be answered by phone at {phone}, {hours}.",
        "Amounts in this article are in US dollars and include taxes where applicable.",
        "For security, never share your full card number in chat or email.",
    ),
    "shipping": (
        "Delivery estimates are updated in real time on the tracking page.",
        "Shipping questions can be answered by our team at {phone}.",
        "Carriers do not deliver on public holidays, which can add a day to the estimate.",
    ),
    "technical": (
        "Technical support is available {hours} at {phone}.",
        "Step-by-step guides and videos for each product are available in the Help Center.",
        "Have the serial number ready when you contact technical support.",
    ),
}

_MAX_ATTEMPTS_PER_DOC = 1000
_SECOND_SENTENCE_P = 0.4
_MIN_CHARS = 360


def support_documents(n: int, seed: int = 0) -> Iterator[Document]:
    """``n`` distinct support articles with doc_ids 0..n-1, deterministic for ``seed``.

    Categories cycle like the course corpus (doc_id % 4) and each category
    visits its topics round-robin in a seeded order, so coverage is even;
    a draw that repeats an earlier article's content is re-drawn.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    cycles = {c: [t for t in TOPICS if t.category == c] for c in CATEGORIES}
    for topics in cycles.values():
        rng.shuffle(topics)
    seen: set[str] = set()
    for doc_id in range(n):
        topics = cycles[CATEGORIES[doc_id % len(CATEGORIES)]]
        topic = topics[(doc_id // len(CATEGORIES)) % len(topics)]
        title, content = _draw_distinct(topic, rng, seen)
        yield Document(doc_id=doc_id, title=title, content=content, category=topic.category)


def _draw_distinct(topic: Topic, rng: random.Random, seen: set[str]) -> tuple[str, str]:
    for _ in range(_MAX_ATTEMPTS_PER_DOC):
        title, content = _compose(topic, rng)
        if content not in seen:
            seen.add(content)
            return title, content
    raise RuntimeError(f"support corpus exhausted for topic {topic.key!r} after {len(seen)} documents")


def _compose(topic: Topic, rng: random.Random) -> tuple[str, str]:
    values = {key: rng.choice(options) for key, options in PARAMS.items()}
    product = rng.choice(topic.products)
    values["product"] = product
    values["a_product"] = ("an " if product[0] in "aeiou" else "a ") + product
    sentences = [rng.choice(topic.openers)]
    for slot in topic.slots:
        sentences += _pick_sentences(slot, rng)
    content = " ".join(sentences).format_map(values)
    # A closing line on half of the articles, and always on the shortest ones.
    if rng.random() < 0.5 or len(content) < _MIN_CHARS:
        content += " " + rng.choice(CLOSERS[topic.category]).format_map(values)
    title = rng.choice(topic.titles).format_map(values)
    return _capitalize(title), content


def _pick_sentences(slot: tuple[str, ...], rng: random.Random) -> list[str]:
    # Sometimes two sentences from a slot (kept in template order) for varied length.
    count = 2 if rng.random() < _SECOND_SENTENCE_P else 1
    return [slot[i] for i in sorted(rng.sample(range(len(slot)), count))]


def _capitalize(text: str) -> str:
    # Titles may start with a product name ("{product} won't turn on").
    return text[:1].upper() + text[1:]
