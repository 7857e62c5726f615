"""Offline stand-ins for the five Hugging Face models the service uses.

The real checkpoints cannot be downloaded here, so this module writes look-alikes
into a Hugging Face hub cache: same repo names, same architectures, same config
fields, same tokenizer classes and special-token ids, but *seeded random
weights*. With ``HF_HOME=<home>`` and ``HF_HUB_OFFLINE=1`` the unchanged
production loading code (``SentenceTransformer(name)``,
``AutoModel*.from_pretrained(name)``, ``pipeline(..., model=name)``) picks them
up from the cache exactly as it would pick up the real downloads.

Two profiles:

* ``faithful``: real shapes and vocab sizes, so compute, memory and disk cost
  match the real models (useful for profiling and capacity planning).
* ``tiny``: the same classes/tokenizers/labels with toy dimensions, built in
  seconds, for tests and CI. The embedder still emits 768-d vectors so FAISS
  indexes are interchangeable between profiles.

Outputs are meaningless (random weights): retrieval order, reranker scores,
sentiment and generated text are noise. Only shapes, dtypes, token counts and
timings are realistic.

CLI: ``python -m builders.standins --profile {tiny,faithful} [--hf-home DIR] [--seed N] [--force]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import random
import shutil
import sys
import time
import uuid
from typing import Any, Callable, Iterable, Iterator

from pipeline import spec
from pipeline.config import Settings

__all__ = [
    "PROFILES",
    "MODEL_NAMES",
    "STANDIN_VERSION",
    "default_standin_home",
    "is_built",
    "build_standins",
    "standin_env",
    "read_marker",
]

log = logging.getLogger(__name__)

PROFILES = ("tiny", "faithful")
# Build order and marker keys; the repo names are the contract's.
MODEL_NAMES = {
    "embedder": spec.EMBEDDER_MODEL,
    "reranker": spec.RERANKER_MODEL,
    "generator": spec.GENERATOR_MODEL,
    "sentiment": spec.SENTIMENT_MODEL,
    "toxicity": spec.TOXICITY_MODEL,
}

# Bump whenever the produced files change, so stale caches get rebuilt.
STANDIN_VERSION = 4
MARKER_NAME = "standins.json"

BANNER = (
    "\n"
    "############################################################################\n"
    "#  STAND-IN MODELS: random weights, NOT the real checkpoints.               #\n"
    "#  Shapes, tokenizers and timings are realistic; every output (embeddings, #\n"
    "#  rerank scores, sentiment, toxicity, generated text) is noise.           #\n"
    "############################################################################"
)


# --------------------------------------------------------------------------- #
# Public helpers
# --------------------------------------------------------------------------- #
def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown stand-in profile {profile!r}; expected one of {PROFILES}")


def default_standin_home(profile: str) -> pathlib.Path:
    """``<repo root>/.cache/standins/<profile>`` (git-ignored via ``.cache/``).

    The settings' own default, read with an empty environment so that
    STANDIN_HOME does not change it (the CLI's ``--hf-home`` does that).
    """
    _check_profile(profile)
    return Settings.from_env({"STANDIN_PROFILE": profile}).standin_dir


def standin_env(hf_home: str | os.PathLike) -> dict[str, str]:
    """Environment variables that make the HF libraries load from ``hf_home`` offline.

    huggingface_hub reads these at import time, so set them before importing
    transformers / sentence_transformers (or pass them to a subprocess).
    """
    return {
        "HF_HOME": str(pathlib.Path(hf_home).resolve()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def read_marker(hf_home: str | os.PathLike) -> dict[str, Any] | None:
    path = pathlib.Path(hf_home) / MARKER_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_built(hf_home: str | os.PathLike, profile: str, seed: int | None = None) -> bool:
    """True when a complete build of ``profile`` (and ``seed``, if given) is in ``hf_home``.

    The marker is written last, so its presence means every model was written.
    """
    _check_profile(profile)
    marker = read_marker(hf_home)
    if not marker or marker.get("profile") != profile or marker.get("version") != STANDIN_VERSION:
        return False
    if seed is not None and marker.get("seed") != seed:
        return False
    hub = pathlib.Path(hf_home) / "hub"
    for info in marker.get("models", {}).values():
        snap = hub / _repo_folder(info["repo"]) / "snapshots" / info["revision"]
        if not (snap / "config.json").is_file():
            return False
    return len(marker.get("models", {})) == len(MODEL_NAMES)


# --------------------------------------------------------------------------- #
# Synthetic English corpus (tokenizer training data + filler stems)
# --------------------------------------------------------------------------- #
# Support-domain and general vocabulary. The tokenizers are trained on text
# generated from these, so common support words become single tokens (as in the
# real vocabularies) and English lands near the real ~4 chars/token.
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
def _corpus() -> tuple[str, ...]:
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


def _pseudo_words() -> Iterator[str]:
    """Short pronounceable pseudo-words ("kotame"), ~6 chars like real SentencePiece pieces.

    Used for the 250k-entry Unigram vocab, whose load time grows with total piece
    length (long affixed fillers made the reranker tokenizer take seconds to load).
    """
    import itertools

    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in (2, 3):
        for combo in itertools.product(syllables, repeat=n):
            yield "".join(combo)


def _fillers(
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


# --------------------------------------------------------------------------- #
# Tokenizers (built with the `tokenizers` library; no downloads)
# --------------------------------------------------------------------------- #
@functools.lru_cache(maxsize=None)
def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2 / Qwen byte-level alphabet: printable stand-ins for all 256 bytes.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _byte_level(text: str) -> str:
    if text.isascii() and text.lstrip(" ").isalpha():  # fast path for fillers: only the space maps
        return text.replace(" ", "Ġ")
    table = _bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


# Characters every tokenizer knows even if the corpus lacks them (real vocabs
# cover them; without this, e.g. "€" or "é" would become [UNK]).
_EXTRA_ALPHABET = sorted(
    set(chr(c) for c in range(0x21, 0x7F))
    | set(chr(c) for c in range(0xA1, 0x180) if chr(c).isprintable())
    | set("€£¥–—‘’“”•…™©®°±×÷")
)

QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_REGULAR_VOCAB = 151643  # ids 0..151642 are BPE tokens; specials start at 151643
QWEN_ADDED_TOKENS = (
    # (id, content, special) exactly as in Qwen2.5's tokenizer_config.json
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)

# The Qwen2.5-Instruct chat template (ChatML + Hermes-style tools), including the
# default system prompt injected when the conversation has none.
QWEN_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def _added_token(content: str, special: bool = True, lstrip: bool = False) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": lstrip,
        "normalized": not special,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def _tokenizer_file_set(tok: Any, config: dict[str, Any], special_map: dict[str, str] | None = None,
                        **extra: str) -> dict[str, str]:
    """The files a tokenizer repo ships: tokenizer.json, its config, the optional
    special-tokens map and any model-specific vocabulary files, in that order."""
    files = {"tokenizer.json": tok.to_str(pretty=False), "tokenizer_config.json": _dumps(config)}
    if special_map is not None:
        files["special_tokens_map.json"] = _dumps(special_map)
    return {**files, **extra}


def _train_bpe_model(tok: Any, corpus: Iterable[str], alphabet: list[str]) -> dict[str, Any]:
    """Train a plain BPE on ``tok`` (normalizer/pre-tokenizer already set); its model JSON.

    Plain BPE is the one `tokenizers` trainer that is reproducible across
    processes (its alphabet ids are sorted and merge ties break on ids). The
    WordPiece and Unigram trainers are not: their hash-map order changes the
    learned vocab from run to run, so those vocabularies are derived from this.
    """
    from tokenizers import trainers

    trainer = trainers.BpeTrainer(
        vocab_size=60000, min_frequency=2, show_progress=False, initial_alphabet=alphabet, special_tokens=[]
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return json.loads(tok.to_str())["model"]


def _train_bpe(tok: Any, corpus: Iterable[str], alphabet: list[str]) -> list[str]:
    """The tokens of :func:`_train_bpe_model`, in id order."""
    vocab = _train_bpe_model(tok, corpus, alphabet)["vocab"]
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


# ---- Qwen2.5: byte-level BPE

QWEN_TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_prefix_space": False,
    "added_tokens_decoder": {str(t): _added_token(c, s) for t, c, s in QWEN_ADDED_TOKENS},
    "additional_special_tokens": [c for tid, c, s in QWEN_ADDED_TOKENS if s and tid != 151643],
    "bos_token": None,
    "chat_template": QWEN_CHAT_TEMPLATE,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "model_max_length": 131072,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer",
    "unk_token": None,
}


def _qwen_pipeline(tok: Any) -> Any:
    """Qwen2's normalizer, pre-tokenizer (split regex, then bytes) and byte-level decoder."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def _qwen_filler(i: int, word: str) -> str:
    # Mostly space-prefixed lower case, some capitalised, some word-internal: like a real BPE vocab.
    r = i % 10
    if r < 7:
        return _byte_level(" " + word)
    if r < 9:
        return _byte_level(" " + word.capitalize())
    return _byte_level(word)


def _qwen_vocab() -> tuple[dict[str, int], list]:
    """The trained BPE vocab padded to exactly 151643 regular entries, and its merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    trained = _train_bpe_model(_qwen_pipeline(Tokenizer(models.BPE())), _corpus(), pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = dict(trained["vocab"])
    # Fillers: decode-only entries (no merge produces them) so any id a random
    # model samples turns into visible, word-like text.
    for tok in _fillers(QWEN_REGULAR_VOCAB - len(vocab), _qwen_filler, set(vocab)):
        vocab[tok] = len(vocab)
    assert len(vocab) == QWEN_REGULAR_VOCAB and max(vocab.values()) == QWEN_REGULAR_VOCAB - 1
    return vocab, trained["merges"]


@functools.lru_cache(maxsize=None)
def _qwen_tokenizer_files() -> dict[str, str]:
    """Byte-level BPE with Qwen2's pre-tokenizer; vocab padded to exactly 151643 entries."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab, merges = _qwen_vocab()
    bpe = models.BPE(
        vocab=vocab,
        merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges],
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = _qwen_pipeline(Tokenizer(bpe))
    tok.add_tokens([AddedToken(c, special=s, normalized=not s) for _, c, s in QWEN_ADDED_TOKENS])
    for tid, content, _ in QWEN_ADDED_TOKENS:
        assert tok.token_to_id(content) == tid, (content, tok.token_to_id(content), tid)
    return _tokenizer_file_set(
        tok,
        QWEN_TOKENIZER_CONFIG,
        **{
            "vocab.json": json.dumps(vocab, ensure_ascii=False, separators=(",", ":")),
            "merges.txt": "#version: 0.2\n" + "\n".join(" ".join(m) if isinstance(m, list) else m for m in merges) + "\n",
        },
    )


# ---- BERT (bge-base, toxic-bert, nlptown): uncased WordPiece

BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
BERT_TOKENIZER_CONFIG = {
    "added_tokens_decoder": {str(i): _added_token(t) for t, i in sorted(BERT_SPECIALS.items(), key=lambda kv: kv[1])},
    "clean_up_tokenization_spaces": True,
    "cls_token": "[CLS]",
    "do_basic_tokenize": True,
    "do_lower_case": True,
    "mask_token": "[MASK]",
    "model_max_length": 512,
    "never_split": None,
    "pad_token": "[PAD]",
    "sep_token": "[SEP]",
    "strip_accents": None,
    "tokenize_chinese_chars": True,
    "tokenizer_class": "BertTokenizer",
    "unk_token": "[UNK]",
}
BERT_SPECIAL_MAP = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]"}


def _bert_pipeline(tok: Any) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _bert_vocab_tokens(vocab_size: int, n_unused: int, multilingual: bool) -> list[str]:
    """Token list laid out like bert-base-uncased: [PAD]=0, [unusedN], [UNK]=100,
    [CLS]=101, [SEP]=102, [MASK]=103, then the learned vocabulary, padded to ``vocab_size``."""
    from tokenizers import Tokenizer, models

    corpus = _corpus() if multilingual else tuple(line for line in _corpus() if line.isascii())
    alphabet = [c for c in _EXTRA_ALPHABET if c.lower() == c]
    # Every BPE piece serves both word-initially and as a "##" continuation.
    learned = [form for t in _train_bpe(_bert_pipeline(Tokenizer(models.BPE())), corpus, alphabet) for form in (t, "##" + t)]

    # Layout of the real uncased BERT vocabularies: unused slots around the specials.
    tokens: list[str] = ["[PAD]"] + [f"[unused{i}]" for i in range(99)]
    tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"[unused{i}]" for i in range(99, n_unused)]
    taken = set(tokens)
    for t in learned:
        if t not in taken:
            taken.add(t)
            tokens.append(t)
    # Whole-word fillers (some as ## continuations) up to the model's vocab size.
    tokens += _fillers(vocab_size - len(tokens), lambda i, w: w if i % 5 else "##" + w, taken)
    assert len(tokens) == vocab_size
    return tokens


@functools.lru_cache(maxsize=None)
def _bert_tokenizer_files(vocab_size: int, n_unused: int, multilingual: bool) -> dict[str, str]:
    """Uncased WordPiece laid out like bert-base-uncased (see :func:`_bert_vocab_tokens`)."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    tokens = _bert_vocab_tokens(vocab_size, n_unused, multilingual)
    vocab = {t: i for i, t in enumerate(tokens)}
    assert all(vocab[k] == v for k, v in BERT_SPECIALS.items())
    tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 101), ("[SEP]", 102)],
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BERT_SPECIALS])
    return _tokenizer_file_set(tok, BERT_TOKENIZER_CONFIG, BERT_SPECIAL_MAP, **{"vocab.txt": "\n".join(tokens) + "\n"})


# ---- XLM-RoBERTa (bge-reranker-base): SentencePiece-style Unigram

XLMR_VOCAB = 250002
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
XLMR_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": XLMR_VOCAB - 1}
XLMR_TOKENIZER_CONFIG = {
    "added_tokens_decoder": {str(i): _added_token(t, lstrip=t == "<mask>") for t, i in XLMR_IDS.items()},
    "bos_token": "<s>",
    "clean_up_tokenization_spaces": True,
    "cls_token": "<s>",
    "eos_token": "</s>",
    "mask_token": "<mask>",
    "model_max_length": 512,
    "pad_token": "<pad>",
    "sep_token": "</s>",
    "sp_model_kwargs": {},
    "tokenizer_class": "XLMRobertaTokenizer",
    "unk_token": "<unk>",
}
XLMR_SPECIAL_MAP = {
    "bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "mask_token": "<mask>",
    "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>",
}


def _xlmr_pipeline(tok: Any) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _xlmr_pieces() -> list[list[Any]]:
    """``[piece, score]`` for all 250002 ids, specials first and <mask> last.

    SentencePiece-style pieces from a (reproducible) BPE run; each piece's score
    is its log-frequency when that BPE segments the corpus, which is what a
    Unigram model's scores estimate.
    """
    from tokenizers import Tokenizer, models

    corpus = _corpus()[::2]  # half is plenty and keeps the build fast
    bpe = _xlmr_pipeline(Tokenizer(models.BPE()))
    learned = _train_bpe(bpe, corpus, _EXTRA_ALPHABET)
    counts = collections.Counter(i for enc in bpe.encode_batch(list(corpus)) for i in enc.ids)
    total = sum(counts.values()) + len(learned)
    # Rounded: full-precision floats double tokenizer.json and its parse time.
    pieces: list[list[Any]] = [[p, 0.0] for p in XLMR_SPECIALS] + [
        [t, round(math.log((counts[i] + 1) / total), 4)] for i, t in enumerate(learned) if t not in XLMR_SPECIALS
    ]
    floor = round(min(s for _, s in pieces[4:]) - 2.0, 1)
    taken = {p for p, _ in pieces} | {"<mask>"}
    pieces += [[f, floor] for f in _fillers(XLMR_VOCAB - 1 - len(pieces), lambda i, w: "▁" + w, taken, _pseudo_words)]
    pieces.append(["<mask>", 0.0])
    assert len(pieces) == XLMR_VOCAB
    return pieces


@functools.lru_cache(maxsize=None)
def _xlmr_tokenizer_files() -> dict[str, str]:
    """SentencePiece-style Unigram: <s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask>=250001."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    pieces = _xlmr_pieces()
    tok = _xlmr_pipeline(Tokenizer(models.Unigram([tuple(p) for p in pieces], unk_id=3, byte_fallback=False)))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in XLMR_SPECIALS]
        + [AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
    )
    return _tokenizer_file_set(tok, XLMR_TOKENIZER_CONFIG, XLMR_SPECIAL_MAP)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- #
# Model configs (written in the real repos' config.json format)
# --------------------------------------------------------------------------- #
def _bert_config(vocab_size: int, dims: dict[str, int], **extra: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": dims["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": dims["intermediate"],
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": dims["heads"],
        "num_hidden_layers": dims["layers"],
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "transformers_version": "4.30.0",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    cfg.update(extra)
    return dict(sorted(cfg.items()))


def _labels(names: list[str]) -> dict[str, Any]:
    return {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }


BASE = {"hidden": 768, "layers": 12, "heads": 12, "intermediate": 3072}  # bert-base
# Toy sizes; the embedder keeps hidden=EMBED_DIM so its vectors keep the contract's
# dimension (FAISS indexes built with either profile work with the other).
TINY = {
    "embedder": {"hidden": spec.EMBED_DIM, "layers": 2, "heads": 12, "intermediate": 256},
    "encoder": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64},
    "generator": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128},
}
QWEN_FAITHFUL = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864}

STAR_LABELS = list(spec.STAR_LABELS)  # id order = star order, as in the real config
TOXIC_LABELS = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
# Output-bias priors for the random toxicity head: roughly the real model's
# base rates on benign text, so a stand-in does not flag half of all messages
# as toxic (the weights themselves stay random).
TOXIC_BIAS_PRIOR = [-3.0, -6.0, -4.5, -6.5, -4.5, -6.0]

QWEN_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "transformers_version": "4.37.0",
}


# Dimensions per profile: "faithful" is the real models' shapes. The embedder's
# hidden size is the contract's embedding dimension in both.
PROFILE_DIMS = {
    "faithful": {"embedder": {**BASE, "hidden": spec.EMBED_DIM}, "encoder": BASE, "generator": QWEN_FAITHFUL},
    "tiny": TINY,
}


def _model_configs(profile: str) -> dict[str, dict[str, Any]]:
    dims = PROFILE_DIMS[profile]
    return {
        "embedder": _bert_config(30522, dims["embedder"], **_labels(["LABEL_0"])),
        "reranker": _reranker_config(dims["encoder"]),
        "generator": _qwen_config(dims["generator"], faithful=profile == "faithful"),
        "sentiment": _sentiment_config(dims["encoder"]),
        "toxicity": _bert_config(
            30522,
            dims["encoder"],
            architectures=["BertForSequenceClassification"],
            problem_type="multi_label_classification",
            **_labels(TOXIC_LABELS),
        ),
    }


def _reranker_config(dims: dict[str, int]) -> dict[str, Any]:
    # bge-reranker-base is an XLM-RoBERTa cross-encoder with one logit.
    return _bert_config(
        XLMR_VOCAB,
        dims,
        architectures=["XLMRobertaForSequenceClassification"],
        model_type="xlm-roberta",
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        layer_norm_eps=1e-05,
        max_position_embeddings=514,
        type_vocab_size=1,
        output_past=True,
        **_labels(["LABEL_0"]),
    )


def _sentiment_config(dims: dict[str, int]) -> dict[str, Any]:
    # nlptown's config carries the old pooler_* fields; kept so the file reads like the real one.
    return _bert_config(
        105879,
        dims,
        architectures=["BertForSequenceClassification"],
        _num_labels=5,
        directionality="bidi",
        finetuning_task="sentiment-analysis",
        output_past=True,
        pooler_fc_size=768,
        pooler_num_attention_heads=12,
        pooler_num_fc_layers=3,
        pooler_size_per_head=128,
        pooler_type="first_token_transform",
        **_labels(STAR_LABELS),
    )


def _qwen_config(gen: dict[str, int], faithful: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": gen["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": gen["intermediate"],
        "max_position_embeddings": 32768,
        "max_window_layers": 21 if faithful else gen["layers"],
        "model_type": "qwen2",
        "num_attention_heads": gen["heads"],
        "num_hidden_layers": gen["layers"],
        "num_key_value_heads": gen["kv_heads"],
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def _tokenizer_files(key: str) -> dict[str, str]:
    # Tokenizers are the same in every profile (token counts must not depend on it).
    if key in ("embedder", "toxicity"):
        return _bert_tokenizer_files(30522, 994, False)
    if key == "sentiment":
        return _bert_tokenizer_files(105879, 99, True)
    if key == "reranker":
        return _xlmr_tokenizer_files()
    return _qwen_tokenizer_files()


def _sentence_transformers_files() -> dict[str, str]:
    # bge-base-en-v1.5's sentence-transformers layout: Transformer -> CLS pooling -> Normalize.
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    pooling = {
        "word_embedding_dimension": spec.EMBED_DIM,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    return {
        "modules.json": _dumps(modules),
        "sentence_bert_config.json": _dumps({"max_seq_length": 512, "do_lower_case": True}),
        "config_sentence_transformers.json": _dumps(
            {"__version__": {"sentence_transformers": "2.2.2", "transformers": "4.28.1", "pytorch": "1.13.0+cu117"}}
        ),
        "1_Pooling/config.json": _dumps(pooling),
    }


def _readme(key: str, profile: str, seed: int) -> str:
    return (
        f"# STAND-IN for {MODEL_NAMES[key]} ({profile} profile, seed {seed})\n\n"
        "Written by `builders.standins`. Same architecture, config format and tokenizer class as the\n"
        "real model, but the weights are **seeded random** and the tokenizer was trained on synthetic\n"
        "English. Outputs are meaningless; only shapes, token counts and timings are realistic.\n"
    )


# --------------------------------------------------------------------------- #
# Hub-cache layout
# --------------------------------------------------------------------------- #
def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _revision(profile: str, repo_id: str, seed: int) -> str:
    # Deterministic 40-hex "commit"; changes with anything that changes the files.
    return hashlib.sha1(f"standin:v{STANDIN_VERSION}:{profile}:{seed}:{repo_id}".encode()).hexdigest()


def _model_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


def _write_text(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    # save_pretrained draws its own progress bar per model; ours is enough.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _variance_preserving_(model: Any) -> None:
    """Redraw every Linear weight with std 1/sqrt(fan_in).

    HF's 0.02 init is a *training* starting point: with untrained weights each
    layer's contribution shrinks, so every input gives (almost) the same output
    (tiny classifiers returned identical logits for all texts). A variance-
    preserving scale keeps activations O(1), so outputs vary with the input the
    way a trained model's do. Embeddings not tied to a Linear keep the 0.02 init
    (a LayerNorm/RMSNorm follows them anyway).
    """
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)


def _build_weights(key: str, snapshot: pathlib.Path, seed: int) -> int:
    """Random-init the architecture named in ``snapshot/config.json`` and save it there."""
    import gc

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(snapshot)
    model_cls = getattr(transformers, config.architectures[0])
    target_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(target_dtype, str):
        target_dtype = getattr(torch, target_dtype)
    if not isinstance(target_dtype, torch.dtype):
        target_dtype = torch.float32
    torch.manual_seed(_model_seed(seed, key))
    # Initialise in fp32 (the usual init path) and only then cast to the checkpoint dtype.
    config.dtype = torch.float32
    model = model_cls(config)
    _variance_preserving_(model)
    if key == "toxicity":
        with torch.no_grad():
            model.classifier.bias.copy_(torch.tensor(TOXIC_BIAS_PRIOR))
    model = model.to(target_dtype).eval()
    n_params = sum(p.numel() for p in model.parameters())
    with _quiet_transformers():
        model.save_pretrained(snapshot, safe_serialization=True)
    del model
    gc.collect()
    return n_params


def _build_repo(hub: pathlib.Path, key: str, profile: str, seed: int, config: dict[str, Any]) -> dict[str, Any]:
    repo_id = MODEL_NAMES[key]
    revision = _revision(profile, repo_id, seed)
    repo = hub / _repo_folder(repo_id)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    _write_text(snapshot / "config.json", _dumps(config))
    n_params = _build_weights(key, snapshot, seed)
    # save_pretrained rewrote these in the installed transformers' format; restore
    # the real repos' files so loading sees what it would see after a download.
    _write_text(snapshot / "config.json", _dumps(config))
    if key == "generator":
        _write_text(snapshot / "generation_config.json", _dumps(QWEN_GENERATION_CONFIG))
    else:
        (snapshot / "generation_config.json").unlink(missing_ok=True)
    for name, text in _tokenizer_files(key).items():
        _write_text(snapshot / name, text)
    if key == "embedder":
        for name, text in _sentence_transformers_files().items():
            _write_text(snapshot / name, text)
    _write_text(snapshot / "README.md", _readme(key, profile, seed))
    # No trailing newline: huggingface_hub reads the ref verbatim.
    _write_text(repo / "refs" / "main", revision)
    # save_pretrained leaves the weights 0600; a cache may be read by another user.
    for path in repo.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return {"repo": repo_id, "revision": revision, "parameters": n_params}


# --------------------------------------------------------------------------- #
# Build orchestration
# --------------------------------------------------------------------------- #
@contextlib.contextmanager
def _build_lock(hf_home: pathlib.Path) -> Iterator[None]:
    """Serialise concurrent builds of the same home (e.g. several workers starting at once)."""
    lock_path = hf_home.parent / f".{hf_home.name}.lock"
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking, builds still never look complete early
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _commit(tmp: pathlib.Path, hf_home: pathlib.Path) -> None:
    """Move a finished build into place; the marker is the last thing to appear."""
    try:
        os.rename(tmp, hf_home)  # atomic when hf_home is absent or an empty dir
        return
    except OSError:
        pass
    # hf_home already holds something (an older build, or a shared HF cache):
    # swap only our five repos, never touching anything else in it, and never
    # replacing a real download that happens to live there.
    hub = hf_home / "hub"
    for repo in (tmp / "hub").iterdir():
        if (hub / repo.name).exists() and not _is_standin_repo(hub / repo.name):
            raise RuntimeError(
                f"{hub / repo.name} holds a real (non-stand-in) model; refusing to overwrite it. "
                "Use a dedicated --hf-home for stand-ins."
            )
    (hf_home / MARKER_NAME).unlink(missing_ok=True)
    hub.mkdir(parents=True, exist_ok=True)
    for repo in sorted((tmp / "hub").iterdir()):
        dest = hub / repo.name
        trash = hub / f".{repo.name}.old-{uuid.uuid4().hex[:8]}"
        if dest.exists():
            os.rename(dest, trash)
        os.rename(repo, dest)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp / MARKER_NAME, hf_home / MARKER_NAME)


def _is_standin_repo(repo: pathlib.Path) -> bool:
    snapshots = list((repo / "snapshots").glob("*"))
    return bool(snapshots) and all(
        (snap / "README.md").is_file() and (snap / "README.md").read_text(errors="replace").startswith("# STAND-IN")
        for snap in snapshots
    )


def _dir_size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_standins(
    profile: str,
    hf_home: str | os.PathLike | None = None,
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
) -> pathlib.Path:
    """Build the five stand-ins into ``hf_home`` (default: :func:`default_standin_home`).

    Idempotent: returns at once when that profile and seed are already built,
    unless ``force``. Builds in a sibling temp dir and moves it into place at the
    end, so an interrupted build never looks complete. Returns ``hf_home``.
    """
    _check_profile(profile)
    hf_home = pathlib.Path(hf_home).expanduser().absolute() if hf_home else default_standin_home(profile)
    if not force and is_built(hf_home, profile, seed):
        return hf_home
    hf_home.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(hf_home):
        if not force and is_built(hf_home, profile, seed):  # built by someone we waited for
            return hf_home
        # Leftovers of interrupted builds (we hold the lock, so none is live).
        for stale in hf_home.parent.glob(f".{hf_home.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)

        log.warning(BANNER)
        log.warning("building %s stand-ins (seed %d) into %s", profile, seed, hf_home)
        started = time.perf_counter()
        tmp = hf_home.parent / f".{hf_home.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            models = _build_all(tmp, profile, seed, progress)
            marker = {
                "profile": profile,
                "seed": seed,
                "version": STANDIN_VERSION,
                "standin": True,
                "note": "random-weight stand-ins of the real models; outputs are meaningless",
                "models": models,
                "build_seconds": round(time.perf_counter() - started, 2),
            }
            _write_text(tmp / MARKER_NAME, _dumps(marker))
            _commit(tmp, hf_home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.warning("stand-ins ready in %s (%.1fs)", hf_home, time.perf_counter() - started)
    return hf_home


def _build_all(root: pathlib.Path, profile: str, seed: int, progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    hub = root / "hub"
    configs = _model_configs(profile)
    models: dict[str, Any] = {}
    bar = tqdm(list(MODEL_NAMES), desc=f"stand-ins ({profile})", unit="model", disable=not progress)
    for key in bar:
        bar.set_postfix_str(MODEL_NAMES[key])
        models[key] = _build_repo(hub, key, profile, seed, configs[key])
    bar.close()
    return models


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.standins",
        description="Build offline random-weight stand-ins of the service's five models into a HF hub cache.",
    )
    parser.add_argument("--profile", choices=PROFILES, default="tiny")
    parser.add_argument("--hf-home", type=pathlib.Path, default=None,
                        help="HF_HOME to write (default: .cache/standins/<profile> in the repo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    hf_home = args.hf_home or default_standin_home(args.profile)
    already = not args.force and is_built(hf_home, args.profile, args.seed)
    started = time.perf_counter()
    hf_home = build_standins(args.profile, hf_home, seed=args.seed, force=args.force, progress=not args.quiet)
    elapsed = time.perf_counter() - started
    marker = read_marker(hf_home) or {}
    print(BANNER.strip("\n"))
    print(f"profile:   {args.profile} (seed {args.seed})" + ("  [already built, nothing to do]" if already else ""))
    print(f"hf_home:   {hf_home}")
    print(f"time:      {elapsed:.1f}s" + ("" if already else f" (build {marker.get('build_seconds', '?')}s)"))
    print(f"disk:      {_dir_size(hf_home / 'hub') / 2**20:.1f} MiB")
    for key, info in marker.get("models", {}).items():
        print(f"  {key:<10} {info['repo']:<50} {info['parameters'] / 1e6:8.1f}M params")
    print("use:       " + " ".join(f"{k}={v}" for k, v in standin_env(hf_home).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
