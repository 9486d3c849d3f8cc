"""doc_* and fin_*: synthetic business documents and financial statements.

Invariant: a document is a pure function of the task seed: Faker is seeded
per task (`seed_instance`) and every date is drawn from a fixed range, so no
document depends on today's date or on the process. References are computed
from the same figures that are rendered. Extraction tasks are scored by
field-level precision and recall (F1, declared partial credit; passed only
when every field is right); figure tasks by one number within a tolerance.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.domains._common import ANSWER_INSTRUCTION, answer_json, close, f1, parse_number
from posttrain.domains.base import Budget, ProceduralDomain, extract_answer
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, StepResult, Task

DATE_LO, DATE_HI = dt.date(2019, 1, 1), dt.date(2024, 12, 31)
PRODUCTS = [
    "Widget",
    "Gasket",
    "Bracket",
    "Cable",
    "Sensor",
    "Valve",
    "Panel",
    "Filter",
    "Bearing",
    "Switch",
    "Adapter",
    "Relay",
    "Hinge",
    "Clamp",
    "Spring",
    "Fuse",
    "Lamp",
    "Motor",
    "Pump",
    "Router",
]
TAX_RATES = [5, 7.5, 8, 10, 12, 20]

_faker_lock = threading.Lock()
_faker: Any = None


def faker(seed: int) -> Any:
    """The process's Faker, reseeded for one document (call under _faker_lock)."""
    global _faker
    if _faker is None:
        from faker import Faker

        _faker = Faker("en_US")
    _faker.seed_instance(seed)
    return _faker


def money(x: float) -> str:
    return f"{x:,.2f}"


def cents(x: float) -> float:
    return round(x + 1e-9, 2)


# ---- verifiers -------------------------------------------------------------------


class NumberVerifier:
    """One number within 0.011 (a cent, or a rounded ratio) ($, commas, % allowed)."""

    name = "numeric_tolerance"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        got = parse_number(extract_answer(episode.completion))
        gold = float(task.reference["value"])
        ok = got is not None and close(got, gold, rel=1e-9)
        reason = "" if ok else ("not a number" if got is None else "wrong value")
        return Score(float(ok), {"outcome": float(ok)}, ok, reason)


class TextVerifier:
    """One short string, compared case- and whitespace-insensitively."""

    name = "normalised_text"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        ok = _norm(extract_answer(episode.completion)) == _norm(task.reference["value"])
        return Score(float(ok), {"outcome": float(ok)}, ok, "" if ok else "wrong answer")


def _norm(x: Any) -> str:
    return " ".join(str(x).split()).casefold().rstrip(".")


def field_matches(gold: Any, got: Any) -> bool:
    """One extracted field against the gold: a number field takes a JSON number or a
    string that `parse_number` reads (`$`, thousands commas, `%`), never a bool; a text
    or date field takes only a string (normalised by `_norm`), never a number or bool."""
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        if isinstance(got, bool):
            return False
        value = got if isinstance(got, (int, float)) else (parse_number(got) if isinstance(got, str) else None)
        try:
            return value is not None and close(float(value), float(gold), rel=1e-9)
        except OverflowError:  # an int too large for a float matches no amount
            return False
    return isinstance(got, str) and _norm(gold) == _norm(got)


class FieldsVerifier:
    """A JSON object of fields: F1 of correct fields (precision over the fields
    given, recall over the fields asked); numbers within tolerance. A multi-turn
    task (its reference has a validator `check`) also reports process (the
    validator accepts the final object) and efficiency (1 / turns used, 0 when
    not every field is right); the value stays F1 of the final object."""

    name = "field_f1"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        got = answer_json(episode.completion)
        gold: dict[str, Any] = task.reference["fields"]
        loop = {}
        if "check" in task.reference:
            loop = {"process": float(not validate_fields(got, task.reference["check"])), "efficiency": 0.0}
        if not isinstance(got, dict):
            return Score(
                0.0, {"outcome": 0.0, "precision": 0.0, "recall": 0.0, **loop}, False, "answer is not a JSON object"
            )
        tp = sum(1 for k, v in got.items() if k in gold and field_matches(gold[k], v))
        precision, recall, value = f1(tp, len(got), len(gold))
        ok = tp == len(gold) == len(got)
        if loop:
            loop["efficiency"] = float(ok) / max(1, len(episode.turns))
        return Score(
            value,
            {"outcome": float(ok), "precision": precision, "recall": recall, **loop},
            ok,
            "" if ok else f"{tp}/{len(gold)} fields right",
        )


# ---- the validator of multi-turn extraction ----------------------------------------
# It sees only `check`: the asked keys with their types, and figures printed in the
# document (line items, discount, shipping, tax rate). It checks form and internal
# consistency, never the hidden gold fields, and its complaints name fields and
# rules, never a value.

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _typed(value: Any, kind: str) -> tuple[Any, str]:
    """(parsed value, "") or (None, what is wrong) for one extracted field."""
    if kind == "text":
        ok = isinstance(value, str) and value.strip() != ""
        return (value, "") if ok else (None, "must be a non-empty string")
    if kind == "date":
        try:
            if isinstance(value, str) and _DATE.fullmatch(value.strip()):
                return dt.date.fromisoformat(value.strip()), ""
        except ValueError:
            pass
        return None, "bad date format (want YYYY-MM-DD)"
    number = (
        value
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else (parse_number(value) if isinstance(value, str) else None)
    )
    if number is None:
        return None, "not a number"
    if kind == "integer" and float(number) != int(number):
        return None, "not a whole number"
    return float(number), ""


def _near(a: float, b: float) -> bool:
    return close(a, b, rel=1e-9)


def _invoice_rules(v: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    out = []
    if "invoice_number" in v and not re.fullmatch(r"INV-\d{5}", v["invoice_number"].strip()):
        out.append("invoice_number: bad format (want INV- and five digits)")
    subtotal = cents(sum(q * p for q, p in facts["lines"]))
    if "subtotal" in v and not _near(v["subtotal"], subtotal):
        out.append("subtotal does not reconcile with the line items (quantity x unit price)")
    tax = cents((subtotal - facts["discount"]) * facts["tax_rate"] / 100)
    if "tax" in v and not _near(v["tax"], tax):
        out.append("tax does not match the tax rate applied to the subtotal after discount")
    total = cents(subtotal - facts["discount"] + v.get("tax", tax) + facts["shipping"])
    if "total" in v and not _near(v["total"], total):
        out.append("total does not reconcile with the line items, discount, tax and shipping")
    if "date" in v and "due_date" in v and v["due_date"] < v["date"]:
        out.append("due_date is before date")
    if "vendor" in v and "customer" in v and _norm(v["vendor"]) == _norm(v["customer"]):
        out.append("vendor and customer are the same company")
    return out


def _payslip_rules(v: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    out = []
    if "hours" in v and not 0 < v["hours"] <= 744:
        out.append("hours: not the hours of one pay period")
    if "hourly_rate" in v and v["hourly_rate"] <= 0:
        out.append("hourly_rate must be positive")
    if "employee" in v and "employer" in v and _norm(v["employee"]) == _norm(v["employer"]):
        out.append("employee and employer are the same name")
    return out


def _balance_rules(v: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    out = [
        f"{k} must not be negative"
        for k in ("total_assets", "total_liabilities", "cash", "long_term_debt")
        if k in v and v[k] < 0
    ]
    if {"equity", "total_assets", "total_liabilities"} <= set(v) and not _near(
        v["equity"], v["total_assets"] - v["total_liabilities"]
    ):
        out.append("equity does not equal total_assets - total_liabilities")
    if "cash" in v and "total_assets" in v and v["cash"] > v["total_assets"]:
        out.append("cash exceeds total_assets")
    if "long_term_debt" in v and "total_liabilities" in v and v["long_term_debt"] > v["total_liabilities"]:
        out.append("long_term_debt exceeds total_liabilities")
    return out


def _income_rules(v: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    out = []
    order = ("revenue", "gross_profit", "operating_income", "net_income")
    present = [k for k in order if k in v]
    out += [f"{b} exceeds {a}" for a, b in zip(present, present[1:]) if v[b] > v[a] + 0.011]
    if "interest_expense" in v and v["interest_expense"] < 0:
        out.append("interest_expense must not be negative")
    return out


RULES: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "invoice": _invoice_rules,
    "payslip": _payslip_rules,
    "balance": _balance_rules,
    "income": _income_rules,
}


def validate_fields(got: Any, check: dict[str, Any]) -> list[str]:
    """The validator's complaints about an extracted object; [] when it accepts."""
    if not isinstance(got, dict):
        return ["the answer is not one JSON object"]
    types: dict[str, str] = check["types"]
    out = [f"missing field: {k}" for k in types if k not in got]
    out += [f"unknown field: {k}" for k in got if k not in types]
    values = {}
    for key, kind in types.items():
        if key in got:
            value, problem = _typed(got[key], kind)
            if problem:
                out.append(f"{key}: {problem}")
            else:
                values[key] = value
    return out + RULES[check["family"]](values, check.get("facts", {}))


class DocEnv:
    """Multi-turn extraction (the Environment contract): each action is the
    extracted JSON object; the observation is "accepted" (the episode ends) or
    "rejected: " and the validator's complaints. Turn parts: {"process": 1.0
    when accepted, else 0.0}."""

    def __init__(self) -> None:
        self.check: dict[str, Any] = {}

    def reset(self, task: Task) -> str:
        self.check = task.reference["check"]
        return ""  # the document and the keys are in the prompt

    def step(self, action: str) -> StepResult:
        complaints = validate_fields(answer_json(action), self.check)
        if not complaints:
            return StepResult("accepted", True, {"process": 1.0})
        return StepResult("rejected: " + "; ".join(complaints), False, {"process": 0.0})

    def close(self) -> None:
        self.check = {}


# ---- documents -------------------------------------------------------------------


@dataclass(frozen=True)
class Invoice:
    number: str
    date: dt.date
    due: dt.date
    vendor: str
    customer: str
    lines: tuple[tuple[str, int, float], ...]
    tax_rate: float
    discount: float
    shipping: float

    @property
    def subtotal(self) -> float:
        return cents(sum(q * p for _, q, p in self.lines))

    @property
    def tax(self) -> float:
        return cents((self.subtotal - self.discount) * self.tax_rate / 100)

    @property
    def total(self) -> float:
        return cents(self.subtotal - self.discount + self.tax + self.shipping)


def make_invoice(rng: random.Random, d: int) -> Invoice:
    with _faker_lock:
        f = faker(rng.getrandbits(32))
        vendor, customer = f.company(), f.company()
        date = f.date_between_dates(DATE_LO, DATE_HI)
    lines = tuple(
        (
            rng.choice(PRODUCTS) + f" {rng.choice('ABCDEFGH')}{rng.randint(1, 99)}",
            rng.randint(1, 5 * d),
            cents(rng.randint(100, 5000 * d) / 100),
        )
        for _ in range(1 + 2 * d)
    )
    return Invoice(
        number=f"INV-{rng.randint(10000, 99999)}",
        date=date,
        due=date + dt.timedelta(days=rng.choice([14, 30, 45, 60])),
        vendor=vendor,
        customer=customer,
        lines=lines,
        tax_rate=rng.choice(TAX_RATES),
        discount=cents(rng.randint(0, 50) * d) if d >= 2 else 0.0,
        shipping=cents(rng.randint(0, 40) * d) if d >= 3 else 0.0,
    )


def render_invoice(inv: Invoice, style: str, show_totals: bool = True) -> str:
    head = [
        f"Invoice {inv.number}",
        f"Date: {inv.date.isoformat()}",
        f"Due: {inv.due.isoformat()}",
        f"From: {inv.vendor}",
        f"Bill to: {inv.customer}",
        "",
    ]
    if style == "md":
        rows = ["| Item | Qty | Unit price | Amount |", "|---|---:|---:|---:|"]
        rows += [f"| {n} | {q} | {money(p)} | {money(q * p)} |" for n, q, p in inv.lines]
    else:
        rows = [f"{'Item':<14}{'Qty':>5}{'Unit':>12}{'Amount':>12}"]
        rows += [f"{n:<14}{q:>5}{money(p):>12}{money(q * p):>12}" for n, q, p in inv.lines]
    tail = [""]
    if inv.discount:
        tail.append(f"Discount: -{money(inv.discount)}")
    if inv.shipping:
        tail.append(f"Shipping: {money(inv.shipping)}")
    tail.append(f"Tax rate: {inv.tax_rate}%")
    if show_totals:
        tail += [f"Subtotal: {money(inv.subtotal)}", f"Tax: {money(inv.tax)}", f"Total due: {money(inv.total)}"]
    return "\n".join(head + rows + tail)


@dataclass(frozen=True)
class Statements:
    company: str
    year: int
    cash: float
    receivables: float
    inventory: float
    ppe: float
    payables: float
    short_debt: float
    long_debt: float
    revenue: float
    prev_revenue: float
    cogs: float
    opex: float
    interest: float
    tax_rate: float
    shares: int

    @property
    def current_assets(self) -> float:
        return cents(self.cash + self.receivables + self.inventory)

    @property
    def total_assets(self) -> float:
        return cents(self.current_assets + self.ppe)

    @property
    def current_liabilities(self) -> float:
        return cents(self.payables + self.short_debt)

    @property
    def total_liabilities(self) -> float:
        return cents(self.current_liabilities + self.long_debt)

    @property
    def equity(self) -> float:
        return cents(self.total_assets - self.total_liabilities)

    @property
    def gross_profit(self) -> float:
        return cents(self.revenue - self.cogs)

    @property
    def ebit(self) -> float:
        return cents(self.gross_profit - self.opex)

    @property
    def pretax(self) -> float:
        return cents(self.ebit - self.interest)

    @property
    def net_income(self) -> float:
        return cents(self.pretax * (1 - self.tax_rate / 100))


def make_statements(rng: random.Random, d: int) -> Statements:
    with _faker_lock:
        company = faker(rng.getrandbits(32)).company()
    scale = 10 ** (2 + d)
    k = lambda lo, hi: cents(rng.randint(lo, hi) * scale / 100)  # noqa: E731
    revenue = k(5000, 20000)
    while True:
        s = Statements(
            company=company,
            year=rng.randint(DATE_LO.year, DATE_HI.year),
            cash=k(200, 3000),
            receivables=k(200, 3000),
            inventory=k(100, 2500),
            ppe=k(1000, 9000),
            payables=k(100, 2000),
            short_debt=k(0, 1500),
            long_debt=k(0, 4000),
            revenue=revenue,
            prev_revenue=k(4000, 20000),
            cogs=cents(revenue * rng.randint(30, 70) / 100),
            opex=cents(revenue * rng.randint(5, 20) / 100),
            interest=k(0, 300),
            tax_rate=rng.choice([15, 21, 25, 30]),
            shares=rng.randint(1, 50) * 10**5,
        )
        if s.equity > 0 and s.pretax > 0:
            return s


def render_balance(s: Statements, style: str) -> str:
    rows = [
        ("Cash", s.cash),
        ("Accounts receivable", s.receivables),
        ("Inventory", s.inventory),
        ("Total current assets", s.current_assets),
        ("Property, plant and equipment", s.ppe),
        ("Total assets", s.total_assets),
        ("Accounts payable", s.payables),
        ("Short-term debt", s.short_debt),
        ("Total current liabilities", s.current_liabilities),
        ("Long-term debt", s.long_debt),
        ("Total liabilities", s.total_liabilities),
        ("Shareholders' equity", s.equity),
    ]
    return _table(f"{s.company}: balance sheet, 31 December {s.year}", rows, style)


def render_income(s: Statements, style: str) -> str:
    rows = [
        ("Revenue", s.revenue),
        (f"Revenue, {s.year - 1}", s.prev_revenue),
        ("Cost of goods sold", s.cogs),
        ("Gross profit", s.gross_profit),
        ("Operating expenses", s.opex),
        ("Operating income (EBIT)", s.ebit),
        ("Interest expense", s.interest),
        ("Income before tax", s.pretax),
        (f"Income tax ({s.tax_rate}%)", cents(s.pretax - s.net_income)),
        ("Net income", s.net_income),
        ("Shares outstanding", float(s.shares)),
    ]
    return _table(f"{s.company}: income statement, year ended 31 December {s.year}", rows, style)


def _table(title: str, rows: list[tuple[str, float]], style: str) -> str:
    if style == "md":
        body = ["| Line item | Amount (USD) |", "|---|---:|"] + [f"| {n} | {money(v)} |" for n, v in rows]
    else:
        body = [f"{n:<34}{money(v):>18}" for n, v in rows]
    return "\n".join([title, ""] + body)


# ---- task builders: (rng, difficulty, style) -> (question, reference) ----------

Builder = Callable[[random.Random, int, str], tuple[str, dict[str, Any]]]


def _num(value: float) -> dict[str, Any]:
    return {"kind": "number", "value": value}


def _fields(
    fields: dict[str, Any], family: str, types: dict[str, str], facts: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A fields reference: the hidden gold `fields` and the validator's `check`
    (the asked keys' types and figures the document prints; never a gold value
    the document does not show)."""
    check = {"family": family, "types": {k: types.get(k, "number") for k in fields}, "facts": facts or {}}
    return {"kind": "fields", "fields": fields, "check": check}


def invoice_fields(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d)
    fields = {"invoice_number": inv.number, "date": inv.date.isoformat(), "vendor": inv.vendor, "total": inv.total}
    if d >= 2:
        fields.update(customer=inv.customer, tax=inv.tax)
    if d >= 3:
        fields.update(due_date=inv.due.isoformat(), subtotal=inv.subtotal)
    keys = ", ".join(fields)
    q = (
        f"{render_invoice(inv, style)}\n\nExtract these fields as one JSON object (keys: {keys}; dates as YYYY-MM-DD, "
        "amounts as numbers)."
    )
    types = {"invoice_number": "text", "date": "date", "due_date": "date", "vendor": "text", "customer": "text"}
    facts = {
        "lines": [[q_, p] for _, q_, p in inv.lines],
        "discount": inv.discount,
        "shipping": inv.shipping,
        "tax_rate": inv.tax_rate,
    }
    return q, _fields(fields, "invoice", types, facts)


def invoice_total(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d)
    return (
        f"{render_invoice(inv, style, show_totals=False)}\n\nTax applies to the subtotal after discount; shipping is "
        "not taxed. "
        "What is the total due? Round to cents.",
        _num(inv.total),
    )


def invoice_tax(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d)
    return (
        f"{render_invoice(inv, style, show_totals=False)}\n\nTax applies to the subtotal after discount. "
        "What is the tax amount? Round to cents.",
        _num(inv.tax),
    )


def invoice_max_item(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d + 1)
    amounts = {}
    for n, q, p in inv.lines:
        amounts[n] = amounts.get(n, 0) + q * p
    best = sorted(amounts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(best) > 1 and abs(best[0][1] - best[1][1]) < 0.005:
        return invoice_max_item(rng, d, style)
    return f"{render_invoice(inv, style)}\n\nWhich item has the largest line amount? Answer with the item name only.", {
        "kind": "text",
        "value": best[0][0],
    }


def invoice_payment_days(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d)
    return f"{render_invoice(inv, style)}\n\nHow many days are there between the invoice date and the due date?", _num(
        float((inv.due - inv.date).days)
    )


def receipt_change(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    inv = make_invoice(rng, d)
    paid = float((int(inv.total) // 20 + 1 + rng.randint(0, 3)) * 20)
    text = render_invoice(inv, style).replace("Invoice", "Receipt", 1) + f"\nPaid in cash: {money(paid)}"
    return f"{text}\n\nHow much change is due to the customer? Round to cents.", _num(cents(paid - inv.total))


def payslip(rng: random.Random, d: int, style: str, ask: str) -> tuple[str, dict[str, Any]]:
    with _faker_lock:
        f = faker(rng.getrandbits(32))
        name, employer = f.name(), f.company()
        date = f.date_between_dates(DATE_LO, DATE_HI)
    hours, rate = rng.randint(60, 180), cents(rng.randint(1500, 6000) / 100)
    overtime = rng.randint(0, 20) if d >= 2 else 0
    gross = cents(hours * rate + overtime * rate * 1.5)
    deductions = [
        ("Income tax", cents(gross * rng.randint(10, 25) / 100)),
        ("Pension", cents(gross * rng.randint(3, 8) / 100)),
    ]
    if d >= 3:
        deductions.append(("Health plan", cents(rng.randint(20, 200))))
    net = cents(gross - sum(v for _, v in deductions))
    rows = [("Hours", float(hours)), ("Hourly rate", rate)] + (
        [("Overtime hours (1.5x)", float(overtime))] if overtime else []
    )
    rows += deductions
    text = _table(f"Payslip: {name}, {employer}, period ending {date.isoformat()}", rows, style)
    if ask == "net":
        return f"{text}\n\nWhat is the net pay (gross pay minus all deductions)? Round to cents.", _num(net)
    fields = {"employee": name, "employer": employer, "period_end": date.isoformat(), "hours": hours}
    if d >= 2:
        fields["hourly_rate"] = rate
    types = {"employee": "text", "employer": "text", "period_end": "date", "hours": "integer"}
    return f"{text}\n\nExtract as one JSON object with keys {', '.join(fields)}.", _fields(fields, "payslip", types)


def bank_statement(rng: random.Random, d: int, style: str, ask: str) -> tuple[str, dict[str, Any]]:
    with _faker_lock:
        f = faker(rng.getrandbits(32))
        holder = f.name()
        start = f.date_between_dates(DATE_LO, DATE_HI - dt.timedelta(days=60))
        payees = [f.company() for _ in range(3 + 3 * d)]
    opening = cents(rng.randint(100, 10000))
    txs, day, balance = [], start, opening
    for payee in payees:
        day = day + dt.timedelta(days=rng.randint(1, 5))
        amount = cents(rng.randint(-90000, 60000) / 100)
        balance = cents(balance + amount)
        txs.append((day, payee, amount))
    if style == "md":
        body = ["| Date | Description | Amount |", "|---|---|---:|"] + [
            f"| {t.isoformat()} | {p} | {money(a)} |" for t, p, a in txs
        ]
    else:
        body = [f"{t.isoformat()}  {p:<36}{money(a):>12}" for t, p, a in txs]
    text = "\n".join([f"Statement for {holder}", f"Opening balance: {money(opening)}", ""] + body)
    if ask == "closing":
        return f"{text}\n\nWhat is the closing balance? Round to cents.", _num(balance)
    debits = [(a, p) for _, p, a in txs if a < 0]
    if not debits:
        return bank_statement(rng, d, style, ask)
    return f"{text}\n\nWhat is the total of all debits (negative amounts), as a negative number?", _num(
        cents(sum(a for a, _ in debits))
    )


def balance_fields(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    s = make_statements(rng, d)
    fields = {"company": s.company, "total_assets": s.total_assets, "total_liabilities": s.total_liabilities}
    if d >= 2:
        fields["equity"] = s.equity
    if d >= 3:
        fields.update(cash=s.cash, long_term_debt=s.long_debt)
    return (
        f"{render_balance(s, style)}\n\nExtract as one JSON object with keys {', '.join(fields)} (amounts as numbers).",
        _fields(fields, "balance", {"company": "text"}),
    )


def income_fields(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
    s = make_statements(rng, d)
    fields = {"company": s.company, "revenue": s.revenue, "net_income": s.net_income}
    if d >= 2:
        fields["gross_profit"] = s.gross_profit
    if d >= 3:
        fields.update(operating_income=s.ebit, interest_expense=s.interest)
    return (
        f"{render_income(s, style)}\n\nExtract as one JSON object with keys {', '.join(fields)} (amounts as numbers).",
        _fields(fields, "income", {"company": "text"}),
    )


def _ratio(kind: str, question: str, value: Callable[[Statements], float]) -> Builder:
    def build(rng: random.Random, d: int, style: str) -> tuple[str, dict[str, Any]]:
        s = make_statements(rng, d)
        doc = (
            render_balance(s, style)
            if kind == "balance"
            else (
                render_income(s, style)
                if kind == "income"
                else render_balance(s, style) + "\n\n" + render_income(s, style)
            )
        )
        if d >= 3 and kind != "both":
            doc = _hide_totals(doc)
        return f"{doc}\n\n{question}", _num(round(value(s), 2))

    return build


def _hide_totals(doc: str) -> str:
    keep = ("Total", "Gross profit", "Operating income", "Income before tax", "Shareholders' equity")
    return "\n".join(line for line in doc.splitlines() if not any(k in line for k in keep))


BUILDERS: dict[str, tuple[str, Builder, str]] = {
    "invoice_fields": ("fields", invoice_fields, "extract invoice fields as JSON"),
    "invoice_total": ("number", invoice_total, "compute an invoice's total"),
    "invoice_tax": ("number", invoice_tax, "compute an invoice's tax"),
    "invoice_max_item": ("text", invoice_max_item, "find the largest invoice line"),
    "invoice_payment_days": ("number", invoice_payment_days, "days between invoice and due date"),
    "receipt_change": ("number", receipt_change, "change due on a cash receipt"),
    "payslip_net": ("number", lambda r, d, s: payslip(r, d, s, "net"), "net pay from a payslip"),
    "payslip_fields": ("fields", lambda r, d, s: payslip(r, d, s, "fields"), "extract payslip fields as JSON"),
    "bank_closing": (
        "number",
        lambda r, d, s: bank_statement(r, d, s, "closing"),
        "closing balance of a bank statement",
    ),
    "bank_debits": ("number", lambda r, d, s: bank_statement(r, d, s, "debits"), "total debits of a bank statement"),
}
FIN_BUILDERS: dict[str, tuple[str, Builder, str]] = {
    "balance_fields": ("fields", balance_fields, "extract balance-sheet figures as JSON"),
    "income_fields": ("fields", income_fields, "extract income-statement figures as JSON"),
    "current_ratio": (
        "number",
        _ratio(
            "balance",
            "What is the current ratio (current assets / current liabilities)? Round to 2 decimals.",
            lambda s: s.current_assets / s.current_liabilities,
        ),
        "current ratio",
    ),
    "debt_to_equity": (
        "number",
        _ratio(
            "balance",
            "What is the debt-to-equity ratio (total liabilities / equity)? Round to 2 decimals.",
            lambda s: s.total_liabilities / s.equity,
        ),
        "debt-to-equity ratio",
    ),
    "working_capital": (
        "number",
        _ratio(
            "balance",
            "What is the working capital (current assets - current liabilities)?",
            lambda s: s.current_assets - s.current_liabilities,
        ),
        "working capital",
    ),
    "equity": (
        "number",
        _ratio("balance", "What is shareholders' equity (total assets - total liabilities)?", lambda s: s.equity),
        "shareholders' equity",
    ),
    "gross_margin": (
        "number",
        _ratio(
            "income",
            "What is the gross margin in percent (gross profit / revenue x 100)? Round to 2 decimals.",
            lambda s: s.gross_profit / s.revenue * 100,
        ),
        "gross margin %",
    ),
    "operating_margin": (
        "number",
        _ratio(
            "income",
            "What is the operating margin in percent (EBIT / revenue x 100)? Round to 2 decimals.",
            lambda s: s.ebit / s.revenue * 100,
        ),
        "operating margin %",
    ),
    "net_margin": (
        "number",
        _ratio(
            "income",
            "What is the net margin in percent (net income / revenue x 100)? Round to 2 decimals.",
            lambda s: s.net_income / s.revenue * 100,
        ),
        "net margin %",
    ),
    "revenue_growth": (
        "number",
        _ratio(
            "income",
            "What is the year-on-year revenue growth in percent? Round to 2 decimals.",
            lambda s: (s.revenue - s.prev_revenue) / s.prev_revenue * 100,
        ),
        "revenue growth %",
    ),
    "eps": (
        "number",
        _ratio(
            "income",
            "What are the earnings per share (net income / shares outstanding)? Round to 2 decimals.",
            lambda s: s.net_income / s.shares,
        ),
        "earnings per share",
    ),
    "interest_coverage": (
        "number",
        _ratio(
            "income",
            "What is the interest coverage ratio (EBIT / interest expense)? Round to 2 decimals.",
            lambda s: s.ebit / s.interest if s.interest else 0.0,
        ),
        "interest coverage",
    ),
    "roe": (
        "number",
        _ratio(
            "both",
            "What is the return on equity in percent (net income / shareholders' equity x 100)? Round to 2 decimals.",
            lambda s: s.net_income / s.equity * 100,
        ),
        "return on equity %",
    ),
}
_VERIFIERS = {"number": NumberVerifier(), "fields": FieldsVerifier(), "text": TextVerifier()}


FEEDBACK = (
    "A validator checks your object (every key present, dates as YYYY-MM-DD, numbers, figures that "
    'reconcile with the document) and answers "accepted" or says what is wrong; then send the corrected '
    "object."
)


class DocDomain(ProceduralDomain):
    """One document task family. Field extraction (`kind` "fields") is multi-turn:
    extract, read the validator's complaints, re-extract (DocEnv); the reward is the
    final object's F1 against the hidden gold. The other kinds are single-turn."""

    levels = 3
    budget = Budget(tokens=256)

    def __init__(self, name: str, category: str, kind: str, builder: Builder, style: str, description: str) -> None:
        self.name, self.category, self.kind = name, category, kind
        self.description = f"{description} ({'Markdown' if style == 'md' else 'plain-text'} tables)"
        self.verifier = _VERIFIERS[kind]
        self.partial_credit = kind == "fields"
        self._builder, self._style = builder, style
        if kind == "fields":
            self.version, self.budget = "2", Budget(turns=3, tokens=256)

    def environment(self) -> type[DocEnv] | None:
        return DocEnv if self.kind == "fields" else None

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:
        question, reference = self._builder(rng, difficulty, self._style)
        feedback = f" {FEEDBACK}" if self.kind == "fields" else ""
        return f"{question}{feedback}\n{ANSWER_INSTRUCTION}", reference

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the gold object, accepted at the first turn."""
        return [self.gold(task)]

    def gold(self, task: Task) -> str:
        ref = task.reference
        if ref["kind"] == "fields":
            return f"<answer>{json.dumps(ref['fields'])}</answer>"
        value = ref["value"]
        return f"<answer>{value:.2f}</answer>" if ref["kind"] == "number" else f"<answer>{value}</answer>"

    def wrong(self, task: Task) -> str:
        ref = task.reference
        if ref["kind"] == "fields":
            fields = dict(ref["fields"])
            key = sorted(fields)[0]
            fields[key] = (
                round(fields[key] * 1.1 + 1, 2) if isinstance(fields[key], (int, float)) else f"{fields[key]} X"
            )
            return f"<answer>{json.dumps(fields)}</answer>"
        if ref["kind"] == "number":
            return f"<answer>{ref['value'] * 1.1 + 1:.2f}</answer>"
        return "<answer>none</answer>"

    def cheats(self, task: Task) -> list[str]:
        """Empty answers, the document echoed, and answers of the wrong JSON type that a
        loose comparison would take: `true` for every field or number (Python's
        True == 1), the gold's numbers as bools and its text as numbers: never accepted."""
        out = ["<answer></answer>", "<answer>{}</answer>", f"<answer>{task.prompt[-1].content}</answer>"]
        ref = task.reference
        if ref["kind"] != "fields":
            return [*out, "<answer>true</answer>", "<answer>[true]</answer>"]
        fields = ref["fields"]
        retyped = {k: (True if isinstance(v, (int, float)) else len(str(v))) for k, v in fields.items()}
        return [
            *out,
            f"<answer>{json.dumps(dict.fromkeys(fields, True))}</answer>",
            f"<answer>{json.dumps(retyped)}</answer>",
        ]


for _key, (_kind, _builder, _desc) in BUILDERS.items():
    for _style in ("md", "text"):
        register(DocDomain(f"doc_{_key}_{_style}", "documents", _kind, _builder, _style, _desc))
for _key, (_kind, _builder, _desc) in FIN_BUILDERS.items():
    register(DocDomain(f"fin_{_key}", "finance", _kind, _builder, "md" if _key != "roe" else "text", _desc))
