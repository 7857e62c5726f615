"""Synthetic English the stand-in tokenizers are trained on, and the filler words that pad each
vocabulary to the real model's size.

Support-domain and general vocabulary: the tokenizers are trained on text generated from these, so
common support words become single tokens (as in the real vocabularies) and English lands near the
real ~4 chars/token. Deterministic: a fixed seed, never the weight seed.
"""
from __future__ import annotations

import functools
import random
from typing import Callable, Iterator

_PRODUCTS = (
    "laptop", "phone", "tablet", "charger", "headphones", "earbuds", "speaker", "monitor", "keyboard",
    "mouse", "printer", "camera", "smartwatch", "router", "backpack", "jacket", "sweater", "dress",
    "shoes", "sneakers", "boots", "jeans", "t-shirt", "blender", "coffee maker", "vacuum cleaner",
    "air fryer", "microwave", "desk lamp", "office chair", "mattress", "pillow", "blanket", "suitcase",
    "water bottle", "yoga mat", "bicycle helmet", "gift card", "subscription box", "phone case",
    "screen protector", "USB cable", "power bank", "gaming console", "controller", "television",
    "sound bar", "hair dryer", "electric toothbrush", "kettle", "toaster", "cookware set", "watch",
)
_ISSUES = (
    "arrived damaged", "never arrived", "stopped working", "is the wrong size", "is the wrong color",
    "is missing parts", "was charged twice", "does not turn on", "keeps disconnecting", "is defective",
    "arrived late", "was not what I ordered", "has a scratch on the screen", "won't charge",
    "makes a strange noise", "overheats after a few minutes", "was delivered to the wrong address",
    "shows a different price than the website", "came without the manual", "has a broken zipper",
)
_TOPICS = (
    "refund", "return", "exchange", "shipping", "delivery", "tracking number", "invoice", "receipt",
    "billing", "payment", "warranty", "replacement", "account", "password", "order", "subscription",
    "cancellation", "discount code", "coupon", "store credit", "loyalty points", "gift card balance",
    "price adjustment", "chargeback", "membership", "two-factor authentication", "email address",
    "shipping address", "billing address", "payment method", "credit card", "bank transfer",
    "promo code", "order history", "return label", "pickup", "repair", "installation", "privacy settings",
)
_CARRIERS = ("UPS", "FedEx", "DHL", "USPS", "the postal service", "our courier partner")
_TIMES = (
    "yesterday", "last week", "two days ago", "on Monday", "on Friday", "this morning", "three weeks ago",
    "last month", "over the weekend", "a few hours ago", "on March 3", "in January", "on the 15th",
)
_NAMES = ("Alex", "Maria", "John", "Priya", "Chen", "Fatima", "Lucas", "Emma", "Omar", "Sofia", "David", "Aisha")
_FEELINGS = (
    "frustrated", "disappointed", "happy", "confused", "annoyed", "grateful", "upset", "pleased",
    "worried", "satisfied", "angry", "impressed",
)
_CUSTOMER_TEMPLATES = (
    "Hi, I ordered a {product} {time} and it {issue}.",
    "My {product} {issue}. Can I get a {topic}?",
    "How long does a {topic} usually take?",
    "I was charged ${price} for order #{order} but I cancelled it {time}.",
    "Where is my order #{order}? The tracking number hasn't updated since {time}.",
    "I can't log in to my account. I tried resetting my password but never got the email.",
    "Can I return the {product} if I already opened the box?",
    "What is your {topic} policy for items bought on sale?",
    "I need to change the shipping address on order #{order}.",
    "Do you ship to Canada, and how much does international shipping cost?",
    "The {product} I received {issue}, and I am really {feeling}.",
    "Please cancel my {topic} and refund the remaining balance.",
    "Is the {product} covered by the warranty if it {issue}?",
    "I have been waiting {days} days for my {topic}. This is unacceptable.",
    "Thank you so much, the replacement {product} works perfectly!",
    "Why was my credit card declined when I tried to pay for the {product}?",
    "Can you send me a copy of the invoice for order #{order}?",
    "I'd like to exchange the {product} for a different size.",
    "My discount code {code} is not working at checkout.",
    "How do I update my payment method on my account?",
    "The courier said the package was delivered, but I never received it.",
    "I'm {feeling} with the service. {carrier} lost my package twice.",
    "Could you explain the extra charge of ${price} on my last bill?",
    "Is it possible to speed up delivery? I need the {product} before {day}.",
    "I want to speak to a manager about my {topic}.",
    "Your website keeps showing an error when I try to check out.",
    "Do you offer a student discount or free shipping on orders over ${price}?",
    "I accidentally ordered two {product}s. Can I cancel one of them?",
)
_AGENT_TEMPLATES = (
    "Hi {name}, thanks for reaching out. I'm sorry to hear that your {product} {issue}.",
    "I have issued a full refund of ${price} to your original payment method. It should appear within {days} business days.",
    "Your order #{order} was shipped with {carrier} and is expected to arrive on {day}.",
    "I have sent a prepaid return label to your email address. Please drop the package off within {days} days.",
    "To reset your password, click 'Forgot password' on the sign-in page and follow the link we email you.",
    "Our {topic} policy allows returns within {days} days of delivery, as long as the item is unused.",
    "I've escalated your case to our {topic} team, and they will contact you within 24 hours.",
    "I completely understand your frustration, and I apologize for the inconvenience.",
    "Could you please confirm the email address associated with your account?",
    "Once we receive the returned {product}, we will process your {topic} within {days} business days.",
    "I have applied a {percent}% discount to your next order as a goodwill gesture.",
    "Your {product} is covered by our {years}-year limited warranty against manufacturing defects.",
    "Please send us a photo of the damaged {product} so we can arrange a replacement.",
    "Is there anything else I can help you with today?",
    "I've updated the shipping address on order #{order}. You will receive a confirmation email shortly.",
    "The duplicate charge was a temporary authorization and will drop off your statement automatically.",
    "Thank you for your patience, {name}. Have a wonderful day!",
)
_KB_TEMPLATES = (
    "Returns: Items can be returned within {days} days of delivery for a full refund. Items must be unused and in the original packaging.",
    "Refunds are issued to the original payment method within {days} business days after the return is inspected.",
    "Standard shipping takes {days} to {days2} business days. Express shipping arrives within 2 business days.",
    "International orders may be subject to customs duties and import taxes, which are the responsibility of the customer.",
    "Warranty: All electronics include a {years}-year limited warranty covering manufacturing defects but not accidental damage.",
    "Exchanges for a different size or color are free of charge if requested within {days} days.",
    "Gift cards cannot be redeemed for cash and do not expire.",
    "If a package is marked as delivered but has not arrived, please wait 48 hours and check with your neighbors before contacting support.",
    "Subscriptions can be cancelled at any time from the account settings page. Cancellation takes effect at the end of the billing period.",
    "For security reasons, password reset links expire after 30 minutes.",
    "Price adjustments are available if an item goes on sale within {days} days of purchase.",
    "Damaged items must be reported within 48 hours of delivery with photos of the product and packaging.",
    "Orders can be modified or cancelled within one hour of purchase. After that, the order enters fulfillment.",
    "We accept Visa, Mastercard, American Express, PayPal, Apple Pay and bank transfers.",
    "Loyalty members earn one point per dollar spent and can redeem {points} points for a ${price} voucher.",
    "Customers can track their orders using the tracking number in the shipping confirmation email.",
    "Two-factor authentication can be enabled in the security section of your account settings.",
)
# General English so the vocabularies are not purely domain-specific.
_GENERAL_WORDS = """
the of and to in is it you that he was for on are with as his they be at one have this from or had by
hot word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know water than call first who
may down side been now find any new work part take get place made live where after back little only
round man year came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell does set three
want air well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal point
mother world near build self earth father head stand own page should country found answer school grow
study still learn plant cover food sun four between state keep eye never last let thought city tree
cross farm hard start might story saw far sea draw left late run while press close night real life few
north open seem together next white children begin got walk example ease paper group always music those
both mark often letter until mile river car feet care second book carry took science eat room friend
began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during
hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry
dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood
contain front teach week final gave green quick develop ocean warm free minute strong special mind behind
clear tail produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead dry wonder
laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes distant fill east
paint language among grand ball yet wave drop heart present heavy dance engine position arm wide sail
material size vary settle speak weight general ice matter circle pair include divide syllable felt
perhaps pick sudden count square reason length represent art subject region energy hunt probable bed
brother egg ride cell believe fraction forest sit race window store summer train sleep prove lone leg
exercise wall catch mount wish sky board joy winter sat written wild instrument kept glass grass cow job
edge sign visit past soft fun bright gas weather month million bear finish happy hope flower clothe
strange gone jump baby eight village meet root buy raise solve metal whether push seven paragraph third
shall held hair describe cook floor either result burn hill safe cat century consider type law bit coast
copy phrase silent tall sand soil roll temperature finger industry value fight lie beat excite natural
view sense ear else quite broke case middle kill son lake moment scale loud spring observe child
straight consonant nation dictionary milk speed method organ pay age section dress cloud surprise quiet
stone tiny climb cool design poor lot experiment bottom key iron single stick flat twenty skin smile
crease hole trade melody trip office receive row mouth exact symbol die least trouble shout except wrote
seed tone join suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire cost
lost brown wear garden equal sent choose fell fit flow fair bank collect save control decimal gentle
woman captain practice separate difficult doctor please protect noon whose locate ring character insect
caught period indicate radio spoke atom human history effect electric expect crop modern element hit
student corner party supply bone rail imagine provide agree thus capital chair danger fruit rich thick
soldier process operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare
poem string bell depend meat rub tube famous dollar stream fear sight thin triangle planet hurry chief
colony clock mine tie enter major fresh search send yellow gun allow print dead spot desert suit current
lift rose continue block chart hat sell success company subtract event particular deal swim term
opposite wife shoe shoulder spread arrange camp invent cotton born determine quart nine truck noise
level chance gather shop stretch throw shine property column molecule select wrong gray repeat require
broad prepare salt nose plural anger claim continent oxygen sugar death pretty skill women season
solution magnet silver thank branch match suffix especially fig afraid huge sister steel discuss forward
similar guide experience score apple bought led pitch coat mass card band rope slip win dream evening
condition feed tool total basic smell valley nor double seat arrive master track parent shore division
sheet substance favor connect post spend chord fat glad original share station dad bread charge proper
bar offer segment slave duck instant market degree populate chick dear enemy reply drink occur support
speech nature range steam motion path liquid log meant quotient teeth shell neck customer service
delivery business manager policy request response issue resolve contact email phone support agent ticket
priority urgent status update confirm verify process receive available unavailable schedule appointment
technical information details detail address problem solution apologize appreciate understand assist
hello hi hey thanks thank please sorry okay yes ok dear regards sincerely best cheers welcome
supposed already because however although unless whether instead actually really probably maybe
says said asks asked tells told gets got gives gave makes made takes took comes came goes went
seems seemed looks looked needs needed wants wanted tries tried uses used works worked keeps kept
received returned ordered charged billed shipped delivered cancelled canceled refunded replaced
exchanged updated changed created deleted removed added paid bought sent tracked contacted called
emailed waited waiting ordering returning charging shipping delivering cancelling updating paying
buying sending tracking contacting calling emailing working trying getting having making taking
orders items products packages payments charges accounts customers days weeks months hours minutes
emails messages questions problems issues answers options details reviews stars prices cards
monthly yearly weekly daily twice once again soon later today tomorrow tonight recently finally
possible impossible available unavailable missing broken damaged wrong correct incorrect late early
online website app login logged signed signup checkout cart basket discount sale stock backorder
label labels box boxes parcel courier carrier driver doorstep neighbor porch mailbox locker pickup
January February March April May June July August September October November December
Monday Tuesday Wednesday Thursday Friday Saturday Sunday weekend holiday
""".split()
_ADJECTIVES = (
    "quick", "slow", "helpful", "friendly", "rude", "late", "early", "broken", "new", "used", "cheap",
    "expensive", "reliable", "simple", "complicated", "clear", "confusing", "excellent", "terrible", "small",
    "large", "heavy", "light", "modern", "classic", "fragile", "sturdy", "convenient", "secure", "official",
)
_PROMPT_LINES = (
    # Chat-format and RAG-prompt words the generator sees in every request.
    "system", "user", "assistant", "tool",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "When given Context and Question, reply as 'Answer: <final answer>' only.",
    "Context:", "Question: {question}", "Answer: {answer}",
    "- Returns and refunds: {kb}", "- Shipping policy: {kb}", "- Warranty coverage: {kb}",
    "- Account and password help: {kb}", "- Billing and payments: {kb}", "- Order tracking: {kb}",
)
_MULTILINGUAL = (
    # A little non-English so the multilingual tokenizers are not English-only.
    "Das Produkt ist sehr gut, aber die Lieferung war langsam.",
    "Ich möchte meine Bestellung stornieren und eine Rückerstattung erhalten.",
    "Le produit est arrivé cassé, je voudrais un remboursement.",
    "Très bon service client, livraison rapide et soignée.",
    "El pedido llegó tarde y el paquete estaba dañado.",
    "Excelente calidad, lo recomiendo a todos mis amigos.",
    "Il prodotto è fantastico, ma la spedizione è stata lenta.",
    "Non sono soddisfatto del servizio clienti.",
    "Het product werkt perfect en de levering was snel.",
    "Ik wil mijn bestelling retourneren, het past niet.",
    "Produkt bardzo dobry, polecam.", "Ótimo produto, chegou antes do prazo.",
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        product=rng.choice(_PRODUCTS),
        issue=rng.choice(_ISSUES),
        topic=rng.choice(_TOPICS),
        carrier=rng.choice(_CARRIERS),
        time=rng.choice(_TIMES),
        day=rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")),
        name=rng.choice(_NAMES),
        feeling=rng.choice(_FEELINGS),
        price=f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}",
        order=rng.randint(100000, 999999),
        code=f"SAVE{rng.randint(5, 50)}",
        days=rng.randint(2, 30),
        days2=rng.randint(5, 14),
        years=rng.randint(1, 3),
        percent=rng.choice((5, 10, 15, 20, 25)),
        points=rng.choice((100, 500, 1000)),
    )


def _general_sentence(rng: random.Random) -> str:
    words = [rng.choice(_GENERAL_WORDS) for _ in range(rng.randint(5, 14))]
    if rng.random() < 0.5:
        words.insert(rng.randrange(len(words)), rng.choice(_ADJECTIVES))
    sentence = " ".join(words)
    sentence = sentence[0].upper() + sentence[1:]
    return sentence + rng.choice((".", ".", ".", "?", "!", ","))


@functools.lru_cache(maxsize=1)
def training_text() -> tuple[str, ...]:
    """Deterministic training text (fixed seed: tokenizers never depend on the weight seed)."""
    rng = random.Random(20240601)
    lines: list[str] = []
    for _ in range(6000):
        lines.append(_fill(rng.choice(_CUSTOMER_TEMPLATES), rng))
        lines.append(_fill(rng.choice(_AGENT_TEMPLATES), rng))
        if rng.random() < 0.5:
            lines.append(_fill(rng.choice(_KB_TEMPLATES), rng))
        lines.append(_general_sentence(rng))
        if rng.random() < 0.05:
            lines.append(rng.choice(_MULTILINGUAL))
        if rng.random() < 0.2:
            lines.append(
                rng.choice(_PROMPT_LINES).format(
                    question=_fill(rng.choice(_CUSTOMER_TEMPLATES), rng),
                    answer=_fill(rng.choice(_AGENT_TEMPLATES), rng),
                    kb=_fill(rng.choice(_KB_TEMPLATES), rng),
                )
            )
    return tuple(lines)


@functools.lru_cache(maxsize=1)
def _stems() -> tuple[str, ...]:
    words: set[str] = set()
    for text in (*_GENERAL_WORDS, *_PRODUCTS, *_ISSUES, *_TOPICS, *_ADJECTIVES, *_FEELINGS):
        for w in text.lower().replace("-", " ").split():
            if w.isascii() and w.isalpha() and len(w) > 1:
                words.add(w)
    return tuple(sorted(words))


_SUFFIXES = (
    "s", "ed", "ing", "er", "ers", "ly", "ness", "ment", "ments", "able", "ful", "less", "ish", "ity",
    "ive", "al", "ation", "ize", "ized", "ist", "ism", "ward", "hood", "ship", "dom", "like", "wise",
    "ery", "ette", "ous",
)
_PREFIXES = (
    "re", "un", "pre", "over", "under", "out", "sub", "co", "non", "mis", "dis", "inter", "super",
    "anti", "semi", "multi", "post", "trans", "micro", "auto",
)


def _filler_words() -> Iterator[str]:
    """Endless deterministic stream of plausible word-like strings (duplicates possible)."""
    stems = _stems()
    for suf in _SUFFIXES:
        for s in stems:
            yield s + suf
    for pre in _PREFIXES:
        for s in stems:
            yield pre + s
    for pre in _PREFIXES:
        for suf in _SUFFIXES:
            for s in stems:
                yield pre + s + suf
    n = 0
    while True:  # practically unreachable; keeps the generator total
        for s in stems:
            yield f"{s}{n}"
        n += 1


def pseudo_words() -> Iterator[str]:
    """Short pronounceable pseudo-words ("kotame"), ~6 chars like real SentencePiece pieces.

    Used for the 250k-entry Unigram vocab, whose load time grows with total piece
    length (long affixed fillers made the reranker tokenizer take seconds to load).
    """
    import itertools

    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in (2, 3):
        for combo in itertools.product(syllables, repeat=n):
            yield "".join(combo)


def fillers(
    count: int, render: Callable[[int, str], str], taken: set[str], words: Callable[[], Iterator[str]] = _filler_words
) -> list[str]:
    """``count`` unique vocab entries not in ``taken``; ``render(i, word)`` applies the
    tokenizer's surface form (space marker, casing)."""
    out: list[str] = []
    seen = set(taken)
    for i, word in enumerate(words()):
        if len(out) >= count:
            break
        tok = render(i, word)
        if tok not in seen:
            seen.add(tok)
            out.append(tok)
    return out
