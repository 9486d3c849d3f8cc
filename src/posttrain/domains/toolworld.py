"""tool_*: tool-using agents in a small JSON world (accounts, orders, hotel
bookings, inventory, support tickets), through one tool-call protocol.

Invariant: the world is a JSON value built from the task seed; tools are pure
functions of (world, arguments) declared with schemas; the reference holds the
gold calls, and the goal is the world they reach. Each turn the model sends
one OpenAI-style call, {"name": TOOL, "arguments": {...}}, or a JSON list of
them; each call's result (or `error: ...` for a malformed call) comes back as
the observation, and `finish` ends the episode. A malformed action is observed
and scored, never a crash. The verifier replays the episode's actions through
a fresh environment and never reads an observation: reward = outcome (the
final world equals the goal world exactly, so collateral changes fail) x (0.8 +
0.1 process + 0.1 efficiency), where process is the share of well-formed calls
and efficiency falls once the call budget is exceeded. One completion holding
every call as a list is one turn of the same environment. At level 1 the
prompt shows the records; above it ids must be looked up.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from typing import Any

from posttrain.domains._modeljson import load_json, same_json
from posttrain.domains.base import Budget, Domain, extract_answer, split_of, stable_rng
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Episode, Message, Score, Split, StepResult, Task, TaskMeta

PEOPLE = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia"]
ITEMS = ["lamp", "kettle", "chair", "desk", "mirror", "rug", "clock", "vase", "fan", "shelf"]
HOTELS = {
    "Pine Inn": "Oslo",
    "Harbor Hotel": "Oslo",
    "Maple Lodge": "Lima",
    "Onyx Suites": "Lima",
    "Tide House": "Pune",
}
DATES = ["2024-03-04", "2024-03-05", "2024-03-06", "2024-03-07"]
TOPICS = ["billing", "shipping", "login", "refund", "warranty"]
MAX_STEPS_FACTOR = 3
CALL_FORMAT = '{"name": TOOL, "arguments": {...}}'

Args = dict[str, Any]

TOOLS: dict[str, dict[str, Any]] = {
    "find_accounts": {"description": "accounts of an owner", "args": {"owner": "string"}},
    "transfer": {
        "description": "move money between accounts",
        "args": {"from_id": "string", "to_id": "string", "amount": "number"},
    },
    "close_account": {"description": "close an account with zero balance", "args": {"account_id": "string"}},
    "find_orders": {"description": "orders of a customer", "args": {"customer": "string"}},
    "cancel_order": {"description": "cancel a pending order", "args": {"order_id": "string"}},
    "refund_order": {
        "description": "refund a cancelled or shipped order into an account",
        "args": {"order_id": "string", "account_id": "string"},
    },
    "search_hotels": {
        "description": "hotels in a city with a free room on a date",
        "args": {"city": "string", "date": "string"},
    },
    "find_bookings": {"description": "bookings of a guest", "args": {"guest": "string"}},
    "book_room": {"description": "book a room", "args": {"guest": "string", "hotel": "string", "date": "string"}},
    "cancel_booking": {"description": "cancel a booking", "args": {"booking_id": "string"}},
    "list_inventory": {"description": "stock of every product", "args": {}},
    "set_stock": {"description": "set a product's stock", "args": {"sku": "string", "units": "integer"}},
    "find_tickets": {"description": "support tickets of a customer", "args": {"customer": "string"}},
    "close_ticket": {
        "description": "close a ticket with a resolution",
        "args": {"ticket_id": "string", "resolution": "string"},
    },
    "finish": {"description": "end the episode", "args": {}},
}
_TYPES = {"string": str, "number": (int, float), "integer": int}


class ToolFailure(Exception):
    """A tool call that is well formed but not allowed in this world state."""


# ---- tools: (world, args) -> result (may mutate world) --------------------------


def _get(table: dict[str, Any], key: str, what: str) -> dict[str, Any]:
    if key not in table:
        raise ToolFailure(f"no {what} {key!r}")
    return table[key]


def tool_find_accounts(w: dict, a: Args) -> Any:
    return [{"id": k, **v} for k, v in sorted(w["accounts"].items()) if v["owner"] == a["owner"]]


def tool_transfer(w: dict, a: Args) -> Any:
    src, dst = _get(w["accounts"], a["from_id"], "account"), _get(w["accounts"], a["to_id"], "account")
    amount = round(float(a["amount"]), 2)
    if a["from_id"] == a["to_id"] or amount <= 0 or src["balance"] < amount or src["closed"] or dst["closed"]:
        raise ToolFailure("transfer not allowed")
    src["balance"] = round(src["balance"] - amount, 2)
    dst["balance"] = round(dst["balance"] + amount, 2)
    return "ok"


def tool_close_account(w: dict, a: Args) -> Any:
    acc = _get(w["accounts"], a["account_id"], "account")
    if acc["balance"] != 0 or acc["closed"]:
        raise ToolFailure("account must be open with zero balance")
    acc["closed"] = True
    return "ok"


def tool_find_orders(w: dict, a: Args) -> Any:
    return [{"id": k, **v} for k, v in sorted(w["orders"].items()) if v["customer"] == a["customer"]]


def tool_cancel_order(w: dict, a: Args) -> Any:
    order = _get(w["orders"], a["order_id"], "order")
    if order["status"] != "pending":
        raise ToolFailure(f"order is {order['status']}")
    order["status"] = "cancelled"
    return "ok"


def tool_refund_order(w: dict, a: Args) -> Any:
    order, acc = _get(w["orders"], a["order_id"], "order"), _get(w["accounts"], a["account_id"], "account")
    if order["status"] not in ("cancelled", "shipped") or acc["owner"] != order["customer"]:
        raise ToolFailure("refund not allowed")
    order["status"] = "refunded"
    acc["balance"] = round(acc["balance"] + order["amount"], 2)
    return "ok"


def tool_search_hotels(w: dict, a: Args) -> Any:
    return sorted(
        h for h, info in w["hotels"].items() if info["city"] == a["city"] and info["free"].get(a["date"], 0) > 0
    )


def tool_find_bookings(w: dict, a: Args) -> Any:
    return [{"id": k, **v} for k, v in sorted(w["bookings"].items()) if v["guest"] == a["guest"]]


def tool_book_room(w: dict, a: Args) -> Any:
    hotel = _get(w["hotels"], a["hotel"], "hotel")
    if hotel["free"].get(a["date"], 0) <= 0:
        raise ToolFailure("no free room")
    hotel["free"][a["date"]] -= 1
    booking_id = f"B{len(w['bookings']) + 1}"
    w["bookings"][booking_id] = {"guest": a["guest"], "hotel": a["hotel"], "date": a["date"], "status": "confirmed"}
    return {"booking_id": booking_id}


def tool_cancel_booking(w: dict, a: Args) -> Any:
    booking = _get(w["bookings"], a["booking_id"], "booking")
    if booking["status"] != "confirmed":
        raise ToolFailure("booking is not confirmed")
    booking["status"] = "cancelled"
    w["hotels"][booking["hotel"]]["free"][booking["date"]] += 1
    return "ok"


def tool_list_inventory(w: dict, a: Args) -> Any:
    return dict(sorted(w["inventory"].items()))


def tool_set_stock(w: dict, a: Args) -> Any:
    _get(w["inventory"], a["sku"], "product")
    if a["units"] < 0:
        raise ToolFailure("units must be >= 0")
    w["inventory"][a["sku"]] = a["units"]
    return "ok"


def tool_find_tickets(w: dict, a: Args) -> Any:
    return [{"id": k, **v} for k, v in sorted(w["tickets"].items()) if v["customer"] == a["customer"]]


def tool_close_ticket(w: dict, a: Args) -> Any:
    ticket = _get(w["tickets"], a["ticket_id"], "ticket")
    if ticket["status"] != "open":
        raise ToolFailure("ticket is not open")
    ticket.update(status="closed", resolution=a["resolution"])
    return "ok"


IMPL: dict[str, Callable[[dict, Args], Any]] = {name: globals()[f"tool_{name}"] for name in TOOLS if name != "finish"}


def validate(call: Any) -> tuple[str, Args]:
    """(tool, arguments) of a well-formed call, or ValueError saying what is wrong."""
    if not isinstance(call, dict) or set(call) - {"name", "arguments"} or "name" not in call:
        raise ValueError('a tool call is {"name": TOOL, "arguments": {...}}')
    name, args = call["name"], call.get("arguments", {})
    if not isinstance(name, str) or name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}")
    schema = TOOLS[name]["args"]
    if not isinstance(args, dict) or set(args) != set(schema):
        raise ValueError(f"{name} takes exactly {sorted(schema)}")
    for key, kind in schema.items():
        if not isinstance(args[key], _TYPES[kind]) or isinstance(args[key], bool):
            raise ValueError(f"{name}.{key} must be a {kind}")
    return name, args


def parse_calls(action: str) -> list[Any]:
    """The tool calls of one action: a JSON object, or a JSON list of them (bare, in
    <answer> tags or in a ```json fence); ValueError when it is neither."""
    body = extract_answer(action)
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    try:
        value = load_json((fenced[-1] if fenced else body).strip())
    except ValueError as exc:
        raise ValueError(f'{exc}: send {{"name": TOOL, "arguments": {{...}}}} or a list of such calls') from None
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise ValueError("an empty list calls no tool")
    return calls


class ToolEnv:
    """One episode in the tool world (the Environment contract): each action is a
    call or a list of calls; the observation is one line per call (the result as
    JSON, or `error: ...` for a malformed call, `failed: ...` for a call the world
    refuses); `finish` ends the episode, and so does the call limit
    (MAX_STEPS_FACTOR x the task's call budget). Turn parts: {"process": share of
    this turn's calls that were well formed}."""

    def __init__(self) -> None:
        self.world: dict[str, Any] = {}
        self.calls = self.valid = 0
        self.done = False
        self.max_calls = 1

    def reset(self, task: Task) -> str:
        self.world = copy.deepcopy(task.reference["world"])
        self.calls = self.valid = 0
        self.done = False
        self.max_calls = MAX_STEPS_FACTOR * task.reference["budget"]
        return ""  # the goal, the tools and (level 1) the records are in the prompt

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult("error: the episode is over", True, {"process": 0.0})
        calls0, valid0 = self.calls, self.valid
        try:
            lines = [self._call(call) for call in parse_calls(action) if not self.done]
        except ValueError as exc:
            self.calls += 1
            lines = [f"error: {exc}"]
        if not self.done and self.calls >= self.max_calls:
            self.done = True
            lines.append(f"error: the call limit ({self.max_calls}) is reached")
        process = (self.valid - valid0) / max(1, self.calls - calls0)
        return StepResult("\n".join(lines), self.done, {"process": process})

    def _call(self, call: Any) -> str:
        self.calls += 1
        try:
            name, args = validate(call)
        except ValueError as exc:
            return f"error: {exc}"
        self.valid += 1
        if name == "finish":
            self.done = True
            return "finished"
        try:
            return json.dumps(IMPL[name](self.world, args), sort_keys=True)
        except ToolFailure as exc:
            return f"failed: {exc}"

    def close(self) -> None:
        self.world = {}


def actions_of(episode: Episode) -> list[str]:
    """The actions of an episode: its turns' actions, or the one completion."""
    return [t.action for t in episode.turns] if episode.turns else [episode.completion]


class ToolVerifier:
    """Replays the episode's actions through a fresh ToolEnv (never reading its
    observations): outcome = the final world equals the goal world; process = the
    share of well-formed calls; efficiency = 1 within the call budget, falling
    linearly above it, and 0 when the goal is not reached. Value = outcome x
    (0.8 + 0.1 process + 0.1 efficiency)."""

    name = "tool_world_goal"
    version = "2"

    def score(self, task: Task, episode: Episode) -> Score:
        env = ToolEnv()
        env.reset(task)
        for action in actions_of(episode):
            if env.step(action).done:
                break
        outcome = float(same_json(env.world, task.reference["goal"]))
        process = env.valid / env.calls if env.calls else 0.0
        budget = task.reference["budget"]
        efficiency = outcome * (1.0 if env.calls <= budget else max(0.0, 1.0 - (env.calls - budget) / budget))
        value = outcome * (0.8 + 0.1 * process + 0.1 * efficiency)
        passed = outcome == 1.0 and process == 1.0 and efficiency == 1.0
        reason = "" if passed else ("goal not reached" if not outcome else "malformed calls or over the call budget")
        return Score(value, {"outcome": outcome, "process": process, "efficiency": efficiency}, passed, reason)


# ---- worlds and scenarios: (rng, difficulty) -> (world, goal text, gold actions) --


def make_world(rng: random.Random, d: int) -> dict[str, Any]:
    people = rng.sample(PEOPLE, 3 + 2 * d)
    accounts, orders, tickets = {}, {}, {}
    for p in people:
        for kind in ("checking", "savings"):
            accounts[f"A{len(accounts) + 101}"] = {
                "owner": p,
                "kind": kind,
                "balance": float(rng.randint(0, 400) * 5),
                "closed": False,
            }
        for _ in range(rng.randint(1, 1 + d)):
            orders[f"O{len(orders) + 501}"] = {
                "customer": p,
                "item": rng.choice(ITEMS),
                "amount": float(rng.randint(5, 200)),
                "status": rng.choice(["pending", "shipped", "pending", "delivered"]),
            }
        if rng.random() < 0.7:
            tickets[f"T{len(tickets) + 901}"] = {
                "customer": p,
                "topic": rng.choice(TOPICS),
                "status": rng.choice(["open", "closed"]),
                "resolution": "",
            }
    hotels = {h: {"city": c, "free": {day: rng.randint(0, 2) for day in DATES}} for h, c in HOTELS.items()}
    bookings = {}
    for p in rng.sample(people, 2 + d):
        hotel = rng.choice(sorted(HOTELS))
        bookings[f"B{len(bookings) + 1}"] = {
            "guest": p,
            "hotel": hotel,
            "date": rng.choice(DATES),
            "status": "confirmed",
        }
    inventory = {f"SKU-{rng.randint(100, 999)}{c}": rng.randint(0, 30) for c in "ABCDEFGH"[: 3 + 2 * d]}
    return {
        "accounts": accounts,
        "orders": orders,
        "hotels": hotels,
        "bookings": bookings,
        "inventory": inventory,
        "tickets": tickets,
    }


def _call(tool: str, **args: Any) -> str:
    return json.dumps({"name": tool, "arguments": args})


def _acct(w: dict, owner: str, kind: str) -> str:
    return next(k for k, v in sorted(w["accounts"].items()) if v["owner"] == owner and v["kind"] == kind)


class Skip(Exception):
    """This world cannot host the scenario; the generator draws another."""


def _owners(w: dict) -> list[str]:
    return sorted({v["owner"] for v in w["accounts"].values()})


def sc_transfer(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    a, b = rng.sample(_owners(w), 2)
    src, dst = _acct(w, a, "checking"), _acct(w, b, rng.choice(["checking", "savings"]))
    if w["accounts"][src]["balance"] < 10:
        raise Skip
    amount = float(rng.randint(1, int(w["accounts"][src]["balance"]) // 5) * 5)
    goal = f"Transfer {amount:.2f} from {a}'s checking account to {b}'s {w['accounts'][dst]['kind']} account."
    return goal, [
        _call("find_accounts", owner=a),
        _call("find_accounts", owner=b),
        _call("transfer", from_id=src, to_id=dst, amount=amount),
    ]


def sc_pay_two(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    a, b, c = rng.sample(_owners(w), 3)
    src = _acct(w, a, "checking")
    bal = w["accounts"][src]["balance"]
    if bal < 20:
        raise Skip
    x, y = float(rng.randint(1, int(bal) // 10)), float(rng.randint(1, int(bal) // 10))
    goal = (
        f"From {a}'s checking account, pay {x:.2f} into {b}'s checking account and {y:.2f} into {c}'s checking account."
    )
    return goal, [
        _call("find_accounts", owner=a),
        _call("find_accounts", owner=b),
        _call("find_accounts", owner=c),
        _call("transfer", from_id=src, to_id=_acct(w, b, "checking"), amount=x),
        _call("transfer", from_id=src, to_id=_acct(w, c, "checking"), amount=y),
    ]


def sc_consolidate(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    a = rng.choice(_owners(w))
    sav, chk = _acct(w, a, "savings"), _acct(w, a, "checking")
    if w["accounts"][sav]["balance"] <= 0:
        raise Skip
    return (
        f"Move all of {a}'s savings into {a}'s checking account.",
        [
            _call("find_accounts", owner=a),
            _call("transfer", from_id=sav, to_id=chk, amount=w["accounts"][sav]["balance"]),
        ],
    )


def sc_close_account(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    a = rng.choice(_owners(w))
    sav, chk = _acct(w, a, "savings"), _acct(w, a, "checking")
    bal = w["accounts"][sav]["balance"]
    steps = [_call("find_accounts", owner=a)] + (
        [_call("transfer", from_id=sav, to_id=chk, amount=bal)] if bal > 0 else []
    )
    return f"Close {a}'s savings account, moving any money in it to {a}'s checking account first.", steps + [
        _call("close_account", account_id=sav)
    ]


def _unique_order(rng: random.Random, w: dict, status: str) -> tuple[str, str, dict]:
    counts: dict[tuple[str, str], list[str]] = {}
    for k, v in sorted(w["orders"].items()):
        counts.setdefault((v["customer"], v["item"]), []).append(k)
    options = [
        (ids[0], w["orders"][ids[0]])
        for ids in counts.values()
        if len(ids) == 1 and w["orders"][ids[0]]["status"] == status
    ]
    if not options:
        raise Skip
    oid, order = rng.choice(options)
    return oid, order["customer"], order


def sc_cancel_order(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    oid, who, order = _unique_order(rng, w, "pending")
    return f"Cancel {who}'s pending order for a {order['item']}.", [
        _call("find_orders", customer=who),
        _call("cancel_order", order_id=oid),
    ]


def sc_cancel_refund(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    oid, who, order = _unique_order(rng, w, "pending")
    return (
        f"Cancel {who}'s pending order for a {order['item']} and refund it to {who}'s checking account.",
        [
            _call("find_orders", customer=who),
            _call("cancel_order", order_id=oid),
            _call("find_accounts", owner=who),
            _call("refund_order", order_id=oid, account_id=_acct(w, who, "checking")),
        ],
    )


def sc_cancel_all_pending(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    who = rng.choice(_owners(w))
    pending = [k for k, v in sorted(w["orders"].items()) if v["customer"] == who and v["status"] == "pending"]
    if not pending:
        raise Skip
    return f"Cancel every pending order of {who}.", [_call("find_orders", customer=who)] + [
        _call("cancel_order", order_id=k) for k in pending
    ]


def sc_refund_shipped(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    who = rng.choice(_owners(w))
    shipped = sorted(
        ((v["amount"], k) for k, v in w["orders"].items() if v["customer"] == who and v["status"] == "shipped"),
        reverse=True,
    )
    if not shipped or (len(shipped) > 1 and shipped[0][0] == shipped[1][0]):
        raise Skip
    oid = shipped[0][1]
    return (
        f"Refund {who}'s most expensive shipped order into {who}'s savings account.",
        [
            _call("find_orders", customer=who),
            _call("find_accounts", owner=who),
            _call("refund_order", order_id=oid, account_id=_acct(w, who, "savings")),
        ],
    )


def sc_book_room(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    who = rng.choice(PEOPLE)
    city, date = rng.choice(sorted(set(HOTELS.values()))), rng.choice(DATES)
    free = sorted(h for h, info in w["hotels"].items() if info["city"] == city and info["free"][date] > 0)
    if not free:
        raise Skip
    return (
        f"Book a room for {who} on {date} in {city}: the first hotel in alphabetical order that has a free room.",
        [_call("search_hotels", city=city, date=date), _call("book_room", guest=who, hotel=free[0], date=date)],
    )


def _unique_booking(rng: random.Random, w: dict) -> tuple[str, dict]:
    guests: dict[str, list[str]] = {}
    for k, v in sorted(w["bookings"].items()):
        guests.setdefault(v["guest"], []).append(k)
    options = [ids[0] for ids in guests.values() if len(ids) == 1]
    if not options:
        raise Skip
    bid = rng.choice(options)
    return bid, w["bookings"][bid]


def sc_cancel_booking(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    bid, b = _unique_booking(rng, w)
    return f"Cancel {b['guest']}'s booking at {b['hotel']}.", [
        _call("find_bookings", guest=b["guest"]),
        _call("cancel_booking", booking_id=bid),
    ]


def sc_reschedule(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    bid, b = _unique_booking(rng, w)
    new = rng.choice([x for x in DATES if x != b["date"]])
    if w["hotels"][b["hotel"]]["free"][new] <= 0:
        raise Skip
    return (
        f"Move {b['guest']}'s booking at {b['hotel']} to {new} (cancel the old booking, then book the new date).",
        [
            _call("find_bookings", guest=b["guest"]),
            _call("cancel_booking", booking_id=bid),
            _call("book_room", guest=b["guest"], hotel=b["hotel"], date=new),
        ],
    )


def sc_restock(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    low, target = rng.randint(5, 15), rng.randint(20, 40)
    skus = [k for k, v in sorted(w["inventory"].items()) if v < low]
    if not skus:
        raise Skip
    return (
        f"Set the stock of every product with fewer than {low} units to {target} units.",
        [_call("list_inventory")] + [_call("set_stock", sku=k, units=target) for k in skus],
    )


def sc_close_ticket(rng: random.Random, w: dict, d: int) -> tuple[str, list[str]]:
    open_ = [(k, v) for k, v in sorted(w["tickets"].items()) if v["status"] == "open"]
    per: dict[str, int] = {}
    for _, v in open_:
        per[v["customer"]] = per.get(v["customer"], 0) + 1
    options = [(k, v) for k, v in open_ if per[v["customer"]] == 1]
    if not options:
        raise Skip
    tid, t = rng.choice(options)
    res = rng.choice(["resolved", "refunded", "duplicate", "wont fix"])
    return (
        f"Close {t['customer']}'s open {t['topic']} ticket with the resolution '{res}'.",
        [_call("find_tickets", customer=t["customer"]), _call("close_ticket", ticket_id=tid, resolution=res)],
    )


SCENARIOS: dict[str, tuple[Callable[[random.Random, dict, int], tuple[str, list[str]]], str]] = {
    "transfer": (sc_transfer, "transfer money between two people's accounts"),
    "pay_two": (sc_pay_two, "two payments from one account"),
    "consolidate": (sc_consolidate, "move all savings into checking"),
    "close_account": (sc_close_account, "empty and close an account"),
    "cancel_order": (sc_cancel_order, "cancel one pending order"),
    "cancel_refund": (sc_cancel_refund, "cancel an order and refund it"),
    "cancel_all_pending": (sc_cancel_all_pending, "cancel every pending order of a customer"),
    "refund_shipped": (sc_refund_shipped, "refund the most expensive shipped order"),
    "book_room": (sc_book_room, "search hotels and book a room"),
    "cancel_booking": (sc_cancel_booking, "cancel a booking"),
    "reschedule": (sc_reschedule, "move a booking to another date"),
    "restock": (sc_restock, "restock low inventory"),
    "close_ticket": (sc_close_ticket, "close a support ticket"),
}


def apply_gold(world: dict[str, Any], actions: list[str]) -> dict[str, Any]:
    w = copy.deepcopy(world)
    for action in actions:
        name, args = validate(json.loads(action))
        if name != "finish":
            IMPL[name](w, args)
    return w


def render_tools() -> str:
    return "\n".join(
        f"- {n}({', '.join(f'{k}: {t}' for k, t in spec['args'].items())}): {spec['description']}"
        for n, spec in TOOLS.items()
    )


class ToolDomain(Domain):
    category = "agents"
    levels = 3
    version = "2"
    budget = Budget(turns=12, tokens=512)

    def __init__(self, scenario: str) -> None:
        self.name = f"tool_{scenario}"
        self.scenario, self.description = SCENARIOS[scenario]
        self.verifier = ToolVerifier()

    def environment(self) -> type[ToolEnv]:
        return ToolEnv

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(2000):
            rng = stable_rng(self.name, self.version, difficulty, split, index, attempt)
            world = make_world(rng, difficulty)
            try:
                goal, actions = self.scenario(rng, world, difficulty)
            except Skip:
                continue
            if split_of(self.name, goal + json.dumps(world, sort_keys=True)) == split:
                return self._task(index, split, difficulty, world, goal, actions + [_call("finish")])
        raise TaskError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def _task(self, index: int, split: Split, difficulty: int, world: dict, goal: str, actions: list[str]) -> Task:
        prompt = (
            f"You operate a back-office system through tools. Goal: {goal}\n\nTools:\n{render_tools()}\n\n"
            + (f"Current records (JSON): {json.dumps(world, sort_keys=True)}\n\n" if difficulty == 1 else "")
            + f"Call one tool per turn as a JSON object {CALL_FORMAT} (or send a JSON list of calls); the "
            "result of each call comes back to you. Look up ids with the find/search/list tools; change "
            "nothing the goal does not ask for. Call finish when the goal is reached."
        )
        reference = {"world": world, "goal": apply_gold(world, actions), "actions": actions, "budget": len(actions) + 2}
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", prompt),),
            reference=reference,
            meta=TaskMeta(split=split, difficulty=difficulty, source="posttrain", taskset_version=self.taskset_version),
        )

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: one call per turn, the last one finish."""
        return list(task.reference["actions"])

    def gold(self, task: Task) -> str:
        """The whole gold sequence as one action: a JSON list of calls."""
        return _calls(task.reference["actions"])

    def wrong(self, task: Task) -> str:
        actions = task.reference["actions"]
        return _calls(actions[:-2] + actions[-1:])

    def cheats(self, task: Task) -> list[str]:
        """Doing nothing, only looking things up, finish claiming success, prose, or the gold
        calls with their numbers sent as `true` (where they have numbers): never accepted."""
        lookups = [a for a in task.reference["actions"] if json.loads(a)["name"].startswith(("find", "search", "list"))]
        actions = task.reference["actions"]
        retyped = [_calls([_retyped(a) for a in actions])] if any(_retyped(a) != a for a in actions) else []
        return [
            _call("finish"),
            _calls(lookups + [_call("finish")]),
            json.dumps({"name": "finish", "arguments": {"goal_reached": True}}),
            "I have completed the task.",
            "",
            *retyped,
        ]


def _calls(actions: list[str]) -> str:
    return "[" + ", ".join(actions) + "]"


def _retyped(action: str) -> str:
    """A gold call with every number argument sent as `true` (which Python's True == 1 would take)."""
    call = json.loads(action)
    args = {
        k: (True if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
        for k, v in call["arguments"].items()
    }
    return json.dumps({"name": call["name"], "arguments": args})


for _scenario in SCENARIOS:
    register(ToolDomain(_scenario))
