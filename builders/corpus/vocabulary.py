"""What every support article draws on: the products, the details drawn once per article (days,
fees, carriers...), the closing lines per category, and the shape of a topic."""
from __future__ import annotations

from dataclasses import dataclass

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


def topic(key, category, products, titles, openers, *slots) -> Topic:
    return Topic(key, category, products, tuple(titles), tuple(openers), tuple(tuple(s) for s in slots))


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
