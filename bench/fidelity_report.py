"""The fidelity bench's report: its rows (from the cases and growing sessions `bench.fidelity`
measured), its tables, and one PASS/MISS line per target of the compression work.

Targets (brim as deployed, method "brim"; every family unless said):

- valid, within budget, system prompt and newest message kept: 100 % of the requests brim sent,
  every family, every API (a request whose system prompt, tools and newest turn alone are over
  the budget is left out: nothing fits it; one brim refused that could fit counts against);
- facts kept: 100 % at ≤ 2.5×, ≥ 2/3 at 5–10×, and 100 % of the facts in the last 8 messages
  at every reduction — on the families of session files (real text, real CLI traffic); the
  last 8 messages' only where the newest turn fits beside the system prompt and tools (else
  they cannot all be kept with the system prompt, which the first target demands);
- next-action evidence kept: ≥ 90 % at ≤ 2.5×, ≥ 85 % in each band from 2.5× to 10×, and more
  than every baseline (on the APIs it runs on) in every band;
- budget used ≥ 80 % by every compressed request whose cut went into text;
- prefix kept between consecutive compressed turns ≥ 95 % of the ceiling's at 8K, ≥ 90 % at
  larger windows;
- billed input per compressed turn with prompt caching ≤ 1.2× the ceiling method's.

The facts and evidence lines also give brim's figure and oldest-first's over all their cells
together, and a baseline's that does better than oldest-first with its lowest share of valid
requests: where brim misses a target, whether any method measured reaches it.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.fidelity import (
    APIS,
    BANDS,
    BASELINES,
    BRIM,
    BRIM_SUMMARIZE,
    BRIMS,
    CACHE_READ,
    CACHE_WRITE,
    CEILING,
    CHAT_ONLY,
    FACTORS,
    GENERATED,
    GROWTH_ROWS,
    LITELLM,
    METHODS,
    OLDEST_FIRST,
    REQUEST_SHARES,
    TEXT_CUT_FLOOR,
    Case,
    Growth,
    band_of,
)
from bench.sessions import API_LABELS

Row = dict[str, Any]


def percent(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 1) if whole else None


def families_of(report: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(s["family"] for s in report["sessions"]))


# ---------------------------------------------------------------- rows


def summarize_cases(cases: Sequence[Case]) -> list[Row]:
    """One row per (family, factor, method, API): shares over the sessions measured (cases
    no method could fit left out, `impossible`)."""
    rows: list[Row] = []
    groups: dict[tuple[str, float, str, str], list[Case]] = defaultdict(list)
    for case in cases:
        groups[case.family, case.factor, case.method, case.api].append(case)
    for (family, factor, method, api), every in groups.items():
        group = [c for c in every if not c.impossible]
        sent = [c for c in group if not c.refused]
        rows.append(
            {
                "family": family,
                "factor": factor,
                "band": band_of(factor),
                "method": method,
                "api": api,
                "cases": len(group),
                "impossible": len(every) - len(group),
                "refused": len(group) - len(sent),
                **{
                    f"{column}_pct": percent(sum(getattr(c, name) for c in sent), len(sent))
                    for column, name in REQUEST_SHARES.items()
                },
                # Where the newest turn can be kept whole at all.
                "newest_kept_pct": percent(
                    sum(c.newest_kept for c in sent if not c.newest_too_big),
                    sum(not c.newest_too_big for c in sent),
                ),
                "newest_too_big": sum(c.newest_too_big for c in group),
                **{
                    f"facts_{where}_{how}_pct": percent(
                        sum(getattr(c, f"facts_{where}_{how}") for c in group),
                        sum(getattr(c, f"facts_{where}") for c in group),
                    )
                    for where in ("older", "recent", "lookalike")
                    for how in ("kept", "recoverable")
                },
                **{
                    f"facts_all_{how}_pct": percent(
                        sum(getattr(c, f"facts_{w}_{how}") for c in group for w in WHERE),
                        sum(getattr(c, f"facts_{w}") for c in group for w in WHERE),
                    )
                    for how in ("kept", "recoverable")
                },
                "facts_in_later_rounds": sum(len(c.further) for c in group),
                "tokens_out_share": round(
                    sum((c.tokens_out or 0) / c.budget for c in sent) / len(sent), 3
                )
                if sent
                else None,
                "summarizer_calls": sum(c.summarizer_calls for c in group),
                "untrimmed": sum(c.note == "untrimmed" for c in group),
                "ms": round(1000 * sum(c.seconds for c in group) / len(group), 1)
                if group
                else None,
            }
        )
    order = {m: n for n, m in enumerate(METHODS)}
    rows.sort(key=lambda r: (r["family"], r["factor"], order[r["method"]], APIS.index(r["api"])))
    return rows


WHERE = ("older", "recent", "lookalike")


def summarize_places(cases: Sequence[Case], places: Mapping[tuple[str, str], str]) -> list[Row]:
    """Per family and method (on Chat, every reduction together): the share of facts kept by
    where they were planted. `places`: (session, fact id) → where."""
    rows: list[Row] = []
    for family in dict.fromkeys(c.family for c in cases):
        mine = {
            k: v
            for k, v in places.items()
            if any(c.session == k[0] and c.family == family for c in cases)
        }
        kinds = sorted(set(mine.values()))
        for method in METHODS:
            group = [
                c for c in cases if (c.family, c.method, c.api) == (family, method, "openai.chat")
            ]
            if not group:
                continue
            row: Row = {"family": family, "method": method}
            for kind in kinds:
                planted = lost = 0
                for case in group:
                    ids = [f for (name, f), k in mine.items() if name == case.session and k == kind]
                    planted += len(ids)
                    lost += sum(f in case.lost for f in ids)
                row[kind] = percent(planted - lost, planted)
            rows.append(row)
    return rows


def _points(runs: Iterable[Growth]) -> Iterable[tuple[Growth, Any]]:
    for run in runs:
        for point in run.points:
            yield run, point


def summarize_evidence(runs: Sequence[Growth]) -> list[Row]:
    """Per (family, band, method, API): the next assistant turns' evidence kept and
    recoverable, over every compressed request of the growing sessions."""
    sums: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for run, point in _points(r for r in runs if r.method != CEILING):
        if point.tokens_out is None and point.evidence == 0:
            continue
        cell = sums[run.family, point.band, run.method, run.api]
        cell[0] += point.evidence > 0
        cell[1] += point.evidence
        cell[2] += point.evidence_kept
        cell[3] += point.evidence_recoverable
    return [
        {
            "family": family,
            "band": band,
            "method": method,
            "api": api,
            "turns": turns,
            "evidence": total,
            "kept": kept,
            "kept_pct": percent(kept, total),
            "recoverable_pct": percent(recoverable, total),
        }
        for (family, band, method, api), (turns, total, kept, recoverable) in sums.items()
    ]


def summarize_budget(cases: Sequence[Case], runs: Sequence[Growth]) -> list[Row]:
    """Per (family, band, method, API), for brim: its compressed requests (cut whole or as the
    session grew), the mean share of the budget they used, those whose cut went into text, and
    those of them that used less than `TEXT_CUT_FLOOR` of it."""
    sums: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])

    def add(key: tuple[str, str, str, str], used: float, cut: bool) -> None:
        cell = sums[key]
        cell[0] += 1
        cell[1] += used
        cell[2] += cut
        cell[3] += cut and used < TEXT_CUT_FLOOR

    for case in cases:
        if case.method in BRIMS and case.tokens_out is not None and case.tokens_in > case.budget:
            key = (case.family, case.band, case.method, case.api)
            add(key, case.tokens_out / case.budget, case.cut_into_text)
    for run, point in _points(r for r in runs if r.method in BRIMS):
        if point.tokens_out is not None:
            key = (run.family, point.band, run.method, run.api)
            add(key, point.tokens_out / run.budget, point.cut_into_text)
    return [
        {
            "family": family,
            "band": band,
            "method": method,
            "api": api,
            "requests": int(count),
            "used_pct": percent(used, count),
            "cut_into_text": int(text),
            "cut_into_text_under_80": int(under),
        }
        for (family, band, method, api), (count, used, text, under) in sums.items()
    ]


def summarize_growth(runs: Sequence[Growth]) -> list[Row]:
    """Per (family, method, API), per window: the growing sessions' figures (sessions at the
    same window together), the billed input per compressed turn and its ratio to the ceiling's."""
    groups: dict[tuple[str, str, str], dict[int, list[Growth]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for run in runs:
        groups[run.family, run.method, run.api][run.window].append(run)
    ceiling_cost: dict[tuple[str, str, int], float | None] = {}
    for (family, method, api), windows in groups.items():
        if method == CEILING:
            for window, group in windows.items():
                ceiling_cost[family, api, window] = _billed_per_turn(group)
    rows: list[Row] = []
    order = {m: n for n, m in enumerate(GROWTH_ROWS)}
    for (family, method, api), windows in sorted(
        groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], APIS.index(kv[0][2]))
    ):
        row: Row = {"family": family, "method": method, "api": api}
        for window, group in sorted(windows.items()):
            turns = sum(g.turns for g in group)
            refused = sum(g.refused for g in group)
            pairs = sum(g.pairs for g in group)
            calls = [c for g in group for c in g.calls_per_turn]
            cost = _billed_per_turn(group)
            best = ceiling_cost.get((family, api, window))
            resends = [g.resend_calls for g in group if g.resend_calls is not None]
            row[str(window)] = {
                "sessions": len(group),
                "budget": group[0].budget,
                "turns": turns,
                "pairs": pairs,
                "prefix_kept_pct": percent(sum(g.prefix_kept for g in group), pairs),
                "valid_pct": percent(sum(g.valid for g in group), turns - refused),
                "within_budget_pct": percent(sum(g.within for g in group), turns - refused),
                "system_kept_pct": percent(
                    sum(p.system_kept for g in group for p in g.points if p.tokens_out is not None),
                    turns - refused,
                ),
                "newest_kept_pct": percent(
                    sum(g.newest_kept for g in group), sum(g.newest_fits for g in group)
                ),
                "refused": refused,
                "untrimmed": sum(g.untrimmed for g in group),
                "sent_per_turn": _sent_per_turn(group),
                "billed_per_turn": cost,
                # Per token sent: 0.1 when every token came from the cache, 1.25 when none did.
                "billed_per_sent": round(cost / sent, 3)
                if cost is not None and (sent := _sent_per_turn(group))
                else None,
                "billed_vs_ceiling": round(cost / best, 2) if cost is not None and best else None,
                # The least those requests could cost: every token read from the cache but the
                # client's new ones (`Point.grew`), which none can hold — the price of their size.
                "billed_floor_vs_ceiling": round(floor / best, 2)
                if (floor := _billed_floor_per_turn(group)) is not None and best
                else None,
                "summarizer_calls_first_turn": group[0].calls_per_turn[0]
                if group[0].calls_per_turn
                else None,
                "summarizer_calls_per_later_turn": round(
                    sum(c for g in group for c in g.calls_per_turn[1:])
                    / sum(len(g.calls_per_turn[1:]) for g in group),
                    2,
                )
                if any(g.calls_per_turn[1:] for g in group)
                else None,
                "summarizer_calls_max": max(calls) if calls else None,
                "resend_calls": max(resends) if resends else None,
                "seconds": round(sum(g.seconds for g in group), 2),
            }
        rows.append(row)
    return rows


def _billed_per_turn(group: Sequence[Growth]) -> float | None:
    billed = [p.billed for g in group for p in g.points if p.tokens_out is not None]
    return round(sum(billed) / len(billed), 1) if billed else None


def _billed_floor_per_turn(group: Sequence[Growth]) -> float | None:
    """What the requests sent would be billed per turn if the prompt cache held all of each but
    the client's new tokens (`Point.grew`): no arrangement of the same sizes costs less."""
    floors = [
        CACHE_READ * (p.tokens_out - new) + CACHE_WRITE * new
        for g in group
        for p in g.points
        if p.tokens_out is not None and g.method != CEILING
        for new in (min(p.grew, p.tokens_out),)
    ]
    return round(sum(floors) / len(floors), 1) if floors else None


def _sent_per_turn(group: Sequence[Growth]) -> float | None:
    sent = [p.tokens_out for g in group for p in g.points if p.tokens_out is not None]
    return round(sum(sent) / len(sent)) if sent else None


# ---------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    name: str
    passed: bool | None  # None: nothing measured
    detail: str

    def line(self) -> str:
        status = "—   " if self.passed is None else ("PASS" if self.passed else "MISS")
        return f"{status}  {self.name}: {self.detail}"


def _worst(
    values: Mapping[str, float | None], good: Callable[[float], bool]
) -> tuple[bool | None, str]:
    measured = {k: v for k, v in values.items() if v is not None}
    if not measured:
        return None, "nothing measured"
    misses = {k: v for k, v in measured.items() if not good(v)}
    shown = misses or measured
    worst = sorted(shown.items(), key=lambda kv: kv[1])[:4]
    text = ", ".join(f"{k} {cell(v)}" for k, v in worst)
    more = len(shown) - len(worst)
    prefix = (
        f"{len(misses)} of {len(measured)} miss: "
        if misses
        else f"all {len(measured)} meet it; lowest: "
    )
    return not misses, prefix + text + (f" (+{more} more)" if more > 0 else "")


def _valid_shares(report: Mapping[str, Any], families: Sequence[str]) -> dict[str, float]:
    """Each method's lowest share of valid requests (tool calls paired as the provider demands),
    over its cases of `families` and its growing sessions."""
    shares: dict[str, float] = {}
    for row in report["fidelity"]:
        if row["family"] in families and row["valid_pct"] is not None:
            shares[row["method"]] = min(row["valid_pct"], shares.get(row["method"], 100.0))
    for row in report["growth"]:
        if row["family"] not in families:
            continue
        for _, figures in _windows(row):
            if figures["valid_pct"] is not None:
                shares[row["method"]] = min(figures["valid_pct"], shares.get(row["method"], 100.0))
    return shares


def _pooled(figures: Mapping[str, float | None], valid: Mapping[str, float]) -> str:
    """`; pooled: brim X %, oldest-first Y %` — each over all its cells together — and the best
    other baseline where it does better than oldest-first, with its lowest share of valid
    requests: whether any method reaches a target that brim misses, and at what price."""
    mine, oldest = figures.get(BRIM), figures.get(OLDEST_FIRST)
    if mine is None or oldest is None:
        return ""
    text = f"; pooled: brim {cell(mine)} %, {OLDEST_FIRST} {cell(oldest)} %"
    others = {
        m: v for m, v in figures.items() if m in BASELINES and m != OLDEST_FIRST and v is not None
    }
    best = max(others, key=others.__getitem__, default=None)
    if best is not None and others[best] > oldest:
        text += f", {best} {cell(others[best])} % (valid {cell(valid.get(best))} % at worst)"
    return text


def targets(report: Mapping[str, Any]) -> list[Target]:
    """One line per target, each over every family (or the session files' families) and API."""
    real = [f for f in families_of(report) if f != GENERATED]
    rows = [r for r in report["fidelity"] if r["method"] == BRIM]
    growth = [r for r in report["growth"] if r["method"] == BRIM]
    out: list[Target] = []

    requests: dict[str, float | None] = {}
    for row in rows:
        for column in ("valid_pct", "within_budget_pct", "system_kept_pct", "newest_kept_pct"):
            key = f"{row['family']} {API_LABELS[row['api']]} {column[:-4]}"
            value = row[column] if not row["refused"] else 0.0
            requests[key] = (
                min(value, requests.get(key) or 100.0) if value is not None else requests.get(key)
            )
    for row in growth:
        for _, figures in _windows(row):
            for column in ("valid_pct", "within_budget_pct", "system_kept_pct", "newest_kept_pct"):
                key = f"{row['family']} {API_LABELS[row['api']]} {column[:-4]}"
                value = figures[column] if not figures["refused"] else 0.0
                if value is not None:
                    requests[key] = min(value, requests.get(key) or 100.0)
    passed, detail = _worst(requests, lambda v: v >= 100)
    out.append(
        Target(
            "valid, within budget, system and newest kept = 100 % (every family, API)",
            passed,
            detail,
        )
    )

    def facts(
        band_names: Sequence[str], column: str, key: Callable[[Mapping[str, Any]], str | None]
    ) -> dict[str, list[float]]:
        """Facts kept and planted, summed per `key` of each case (None: left out)."""
        kept: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for case in report["cases"]:
            if case["family"] not in real or case["impossible"]:
                continue
            if column == "recent" and case.get("newest_too_big", False):
                continue  # the newest turn alone does not fit beside the system prompt
            if band_names and case["band"] not in band_names:
                continue
            name = key(case)
            if name is None:
                continue
            wheres = ("recent",) if column == "recent" else WHERE
            kept[name][0] += sum(case[f"facts_{w}_kept"] for w in wheres)
            kept[name][1] += sum(case[f"facts_{w}"] for w in wheres)
        return kept

    def brim_facts(band_names: Sequence[str], column: str) -> dict[str, float | None]:
        def family_api(case: Mapping[str, Any]) -> str | None:
            return f"{case['family']} {API_LABELS[case['api']]}" if case["method"] == BRIM else None

        return {k: percent(a, b) for k, (a, b) in facts(band_names, column, family_api).items()}

    def facts_pooled(band_names: Sequence[str], column: str) -> str:
        sums = facts(band_names, column, lambda case: case["method"])
        return _pooled({m: percent(a, b) for m, (a, b) in sums.items()}, valid)

    valid = _valid_shares(report, real)
    for name, bands, column, good in (
        ("facts kept at ≤ 2.5× = 100 % (session files)", [BANDS[0]], "all", 100.0),
        ("facts kept at 5–10× ≥ 2/3 (session files)", [BANDS[2]], "all", 200 / 3),
        ("facts of the last 8 messages kept = 100 % (session files)", [], "recent", 100.0),
    ):
        passed, detail = _worst(brim_facts(bands, column), partial(operator.le, good))
        out.append(Target(name, passed, detail + facts_pooled(bands, column)))

    evidence = {(r["family"], r["band"], r["method"], r["api"]): r for r in report["evidence"]}

    def brim_evidence(bands: Sequence[str]) -> dict[str, float | None]:
        return {
            f"{family} {API_LABELS[api]} {band}": r["kept_pct"]
            for (family, band, method, api), r in evidence.items()
            if method == BRIM and band in bands
        }

    evidence_valid = _valid_shares(report, families_of(report))

    def evidence_pooled(bands: Sequence[str]) -> str:
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for (_, band, method, _), r in evidence.items():
            if band in bands:
                sums[method][0] += r["kept"]
                sums[method][1] += r["evidence"]
        return _pooled({m: percent(a, b) for m, (a, b) in sums.items()}, evidence_valid)

    passed, detail = _worst(brim_evidence([BANDS[0]]), lambda v: v >= 90)
    detail += evidence_pooled([BANDS[0]])
    out.append(Target("next-action evidence kept at ≤ 2.5× ≥ 90 %", passed, detail))
    passed, detail = _worst(brim_evidence(BANDS[1:3]), lambda v: v >= 85)
    detail += evidence_pooled(BANDS[1:3])
    out.append(Target("next-action evidence kept at 2.5–10× ≥ 85 % (each band)", passed, detail))
    margins: dict[str, float | None] = {}
    for (family, band, method, api), r in evidence.items():
        if method != BRIM or r["kept_pct"] is None:
            continue
        rivals = [
            evidence[family, band, b, api]["kept_pct"]
            for b in BASELINES
            if (family, band, b, api) in evidence
            and evidence[family, band, b, api]["kept_pct"] is not None
        ]
        if rivals:
            margins[f"{family} {API_LABELS[api]} {band}"] = round(r["kept_pct"] - max(rivals), 1)
    passed, detail = _worst(margins, lambda v: v > 0)
    out.append(
        Target(
            "next-action evidence kept above every baseline, every band (points ahead of the best)",
            passed,
            detail,
        )
    )

    under = [r for r in report["budget"] if r["method"] == BRIM]
    cut = sum(r["cut_into_text"] for r in under)
    short = sum(r["cut_into_text_under_80"] for r in under)
    share = percent(short, cut)
    worst_bands = sorted(
        (r for r in under if r["cut_into_text_under_80"]),
        key=lambda r: -r["cut_into_text_under_80"],
    )[:3]
    detail = f"{short} of {cut} requests with a cut into text used < 80 % ({cell(share)} %)" + (
        "; most in "
        + ", ".join(
            f"{r['family']} {API_LABELS[r['api']]} {r['band']} ({r['cut_into_text_under_80']})"
            for r in worst_bands
        )
        if worst_bands
        else ""
    )
    out.append(
        Target(
            "budget used ≥ 80 % whenever a cut went into text",
            None if not cut else short == 0,
            detail,
        )
    )

    def prefix_share(figures: Mapping[str, Any], ceiling: Mapping[str, Any]) -> float | None:
        """A cell's prefix kept as a share of the ceiling's, in %."""
        if figures["prefix_kept_pct"] is None or not ceiling.get("prefix_kept_pct"):
            return None
        return float(100 * figures["prefix_kept_pct"] / ceiling["prefix_kept_pct"])

    ceilings = {(r["family"], r["api"]): r for r in report["growth"] if r["method"] == CEILING}
    prefix: dict[str, float | None] = {}
    cost: dict[str, float | None] = {}
    for row in growth:
        best = ceilings.get((row["family"], row["api"]), {})
        for window, figures in _windows(row):
            key = f"{row['family']} {API_LABELS[row['api']]} {int(window) // 1024}K"
            share = prefix_share(figures, best.get(window, {}))
            if share is not None:
                prefix[key] = round(share - (95 if int(window) <= 8_192 else 90), 1)
            cost[key] = figures["billed_vs_ceiling"]

    passed, detail = _worst(prefix, lambda v: v >= 0)
    detail += _growth_pooled(report, prefix_share, "% of the ceiling's", higher=True)
    out.append(
        Target(
            "prefix kept ≥ 95 % of the ceiling's at 8K, ≥ 90 % above (points over the floor)",
            passed,
            detail,
        )
    )
    passed, detail = _worst({k: -v for k, v in cost.items() if v is not None}, lambda v: v >= -1.2)
    detail = detail.replace(" -", " ").replace(" −", " ")
    detail += _growth_pooled(
        report, lambda figures, _: figures["billed_vs_ceiling"], "× the ceiling's", higher=False
    )
    floors = [
        figures["billed_floor_vs_ceiling"]
        for row in growth
        for _, figures in _windows(row)
        if figures.get("billed_floor_vs_ceiling") is not None
    ]
    if floors:
        over = sum(floor > 1.2 for floor in floors)
        detail += (
            "; brim's requests as sent, every token but the client's new ones read from the cache"
            f" (as if no re-cut): {cell(sum(floors) / len(floors))}× on average, over 1.2× in"
            f" {over} of {len(floors)} cells"
        )
    out.append(
        Target(
            "billed input per compressed turn with caching ≤ 1.2× the ceiling's (× ceiling)",
            passed,
            detail,
        )
    )
    return out


def _growth_pooled(
    report: Mapping[str, Any],
    value: Callable[[Mapping[str, Any], Mapping[str, Any]], float | None],
    unit: str,
    higher: bool,
) -> str:
    """`; pooled (unit, mean over cells): brim X, oldest-first Y` over the growing sessions —
    each method's `value` of a cell's figures beside the ceiling's — and the best other baseline
    where it does better than oldest-first, with its lowest shares of valid requests and of
    requests that kept the newest turn: whether any method reaches a target brim misses."""
    ceilings = {(r["family"], r["api"]): r for r in report["growth"] if r["method"] == CEILING}
    values: dict[str, list[float]] = defaultdict(list)
    newest: dict[str, float] = {}
    for row in report["growth"]:
        if row["method"] == CEILING:
            continue
        for window, figures in _windows(row):
            found = value(figures, ceilings.get((row["family"], row["api"]), {}).get(window, {}))
            if found is not None:
                values[row["method"]].append(found)
            if figures["newest_kept_pct"] is not None:
                newest[row["method"]] = min(
                    figures["newest_kept_pct"], newest.get(row["method"], 100.0)
                )
    means = {m: sum(v) / len(v) for m, v in values.items() if v}
    mine, oldest = means.get(BRIM), means.get(OLDEST_FIRST)
    if mine is None or oldest is None:
        return ""
    sign = 1 if higher else -1
    text = f"; pooled ({unit}, mean over cells): brim {cell(mine)}, {OLDEST_FIRST} {cell(oldest)}"
    others = {m: v for m, v in means.items() if m in BASELINES and m != OLDEST_FIRST}
    best = max(others, key=lambda m: sign * others[m], default=None)
    if best is not None and sign * others[best] > sign * oldest:
        valid = _valid_shares(report, families_of(report))
        text += (
            f", {best} {cell(others[best])} (valid {cell(valid.get(best))} %,"
            f" newest kept {cell(newest.get(best))} % at worst)"
        )
    return text


def _windows(row: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(k, v) for k, v in row.items() if k.isdigit()]


# ---------------------------------------------------------------- tables


def cell(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def cells(values: Sequence[float | None]) -> str:
    """One figure per column, or one figure where they are all the same."""
    shown = [cell(value) for value in values]
    return shown[0] if len(set(shown)) == 1 else " · ".join(shown)


def header(report: Mapping[str, Any]) -> list[str]:
    lines = ["brim context fidelity" + (" (quick)" if report["quick"] else "")]
    for family in families_of(report):
        mine = [s for s in report["sessions"] if s["family"] == family]
        apis = sorted({s["api"] for s in mine})
        lines.append(
            f"- {family}: {len(mine)} session(s) of "
            + ", ".join(f"{s['tokens']:,}" for s in mine)
            + " tokens (Chat, o200k)"
            + (f", as sent in {', '.join(apis)}" if apis != ["generated"] else "")
            + f"; {sum(s['facts'] for s in mine)} facts"
            + (
                f" and {sum(s['lookalike_facts'] for s in mine)} look-alike facts"
                if any(s["lookalike_facts"] for s in mine)
                else ""
            )
            + f"; {sum(s['evidence_turns'] for s in mine)} assistant turns using "
            f"{sum(s['evidence_tokens'] for s in mine)} evidence tokens"
        )
    return lines


def render_targets(report: Mapping[str, Any]) -> str:
    lines = ["Targets (brim as deployed):", ""]
    lines += [target.line() for target in targets(report)]
    return "\n".join(lines)


def render_family(report: Mapping[str, Any], family: str) -> str:
    """A family's tables: facts per reduction, evidence and budget used per band, growing
    sessions per window."""
    factors = " · ".join(f"{f:g}×" for f in FACTORS)
    lines = [
        f"## {family}",
        "",
        f"Facts, whole session cut {factors} (one figure when all are equal), % of requests or "
        "of facts; refused = brim answered 400 instead; n/a: a case whose system prompt, tools "
        "and newest turn alone are over the budget.",
        "",
        "| method | API | valid | within budget | system kept | newest kept | facts kept, older "
        "| facts recoverable, older | facts kept, last 8 | look-alike facts kept "
        "| look-alike facts recoverable | tokens / budget | refused | n/a |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows = [r for r in report["fidelity"] if r["family"] == family]
    for method in METHODS:
        for api in APIS:
            mine = {r["factor"]: r for r in rows if (r["method"], r["api"]) == (method, api)}
            if not mine:
                continue
            ordered = [mine.get(f) for f in FACTORS]

            def column(key: str, ordered: list[Row | None] = ordered) -> str:
                return cells([r[key] if r else None for r in ordered])

            label = API_LABELS[api] + (" (others n/a)" if method in CHAT_ONLY else "")
            lines.append(
                f"| {method} | {label} | {column('valid_pct')} | {column('within_budget_pct')} "
                f"| {column('system_kept_pct')} | {column('newest_kept_pct')} "
                f"| {column('facts_older_kept_pct')} | {column('facts_older_recoverable_pct')} "
                f"| {column('facts_recent_kept_pct')} | {column('facts_lookalike_kept_pct')} "
                f"| {column('facts_lookalike_recoverable_pct')} | {column('tokens_out_share')} "
                f"| {column('refused')} | {column('impossible')} |"
            )
    evidence = {
        (r["band"], r["method"], r["api"]): r for r in report["evidence"] if r["family"] == family
    }
    lines += [
        "",
        "Next-action evidence kept (recoverable), % of the evidence tokens of the assistant "
        "turns after each compressed request, per reduction band of that request "
        "(turns measured):",
        "",
        "| method | API | " + " | ".join(BANDS) + " |",
        "|---|---|" + "--:|" * len(BANDS),
    ]
    for method in METHODS:
        for api in APIS:
            figures = [evidence.get((band, method, api)) for band in BANDS]
            if not any(figures):
                continue
            shown = [
                "—"
                if r is None or r["kept_pct"] is None
                else f"{cell(r['kept_pct'])} ({cell(r['recoverable_pct'])}; {r['turns']})"
                for r in figures
            ]
            lines.append(f"| {method} | {API_LABELS[api]} | " + " | ".join(shown) + " |")
    budget = {
        (r["band"], r["method"], r["api"]): r for r in report["budget"] if r["family"] == family
    }
    lines += [
        "",
        "Budget used by brim's compressed requests, mean % of the budget (requests; with a cut "
        "into text; of those under 80 %):",
        "",
        "| method | API | " + " | ".join(BANDS) + " |",
        "|---|---|" + "--:|" * len(BANDS),
    ]
    for method in (BRIM, BRIM_SUMMARIZE):
        for api in APIS:
            figures = [budget.get((band, method, api)) for band in BANDS]
            if not any(figures):
                continue
            shown = [
                "—"
                if r is None
                else f"{cell(r['used_pct'])} ({r['requests']}; {r['cut_into_text']}; {r['cut_into_text_under_80']})"
                for r in figures
            ]
            lines.append(f"| {method} | {API_LABELS[api]} | " + " | ".join(shown) + " |")
    growth = [r for r in report["growth"] if r["family"] == family]
    lines += [
        "",
        "Growing sessions, per window: compressed turns, prefix kept (% of consecutive "
        "compressed requests where the earlier is a byte-identical prefix of the later), newest "
        "kept, tokens sent and input billed per compressed turn with prompt caching "
        "(input-token prices: cache reads 0.1×, writes 1.25×), billed per token sent (0.1: all "
        "from the cache, 1.25: none), and billed per turn as a multiple of the ceiling method's "
        "(which sends the least it can after each cut, so it pays for fewer tokens):",
        "",
        "| method | API | window | turns | prefix kept | newest kept | tokens sent / turn "
        "| billed / turn | billed / token sent | × ceiling |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in growth:
        api = API_LABELS[row["api"]] + (" (others n/a)" if row["method"] in CHAT_ONLY else "")
        for window, at in _windows(row):
            lines.append(
                f"| {row['method']} | {api} | {int(window) // 1024}K | {at['turns']} "
                f"| {cell(at['prefix_kept_pct'])} | {cell(at['newest_kept_pct'])} "
                f"| {cell(at['sent_per_turn'])} | {cell(at['billed_per_turn'])} "
                f"| {at['billed_per_sent'] if at['billed_per_sent'] is not None else '—'} "
                f"| {cell(at['billed_vs_ceiling'])} |"
            )
    return "\n".join(lines)


def render_details(report: Mapping[str, Any]) -> str:
    """What the generated family shows besides: facts by where they were planted, LiteLLM's
    give-ups, the summarizer's calls."""
    lines: list[str] = []
    litellm = [r for r in report["fidelity"] if r["method"] == LITELLM]
    gave_up = sum(r["untrimmed"] for r in litellm)
    if gave_up:
        lines += [
            f"LiteLLM's trim_messages returned the messages untrimmed in {gave_up} of "
            f"{sum(r['cases'] for r in litellm)} cases: it raised on an assistant message with "
            "`content: null` (a tool call) and caught its own exception.",
            "",
        ]
    for family in families_of(report):
        rows = [r for r in report["facts_by_place"] if r["family"] == family]
        if not rows:
            continue
        kinds = [k for k in rows[0] if k not in ("method", "family")]
        lines += [
            f"**Facts kept by where they were planted** ({family}; Chat, all four reductions "
            "together)",
            "",
            "| method | " + " | ".join(kinds) + " |",
            "|---|" + "--:|" * len(kinds),
        ]
        for row in rows:
            lines.append(
                f"| {row['method']} | " + " | ".join(cell(row.get(k)) for k in kinds) + " |"
            )
        lines.append("")
    windows = [str(w) for w in report["windows"]]
    labels = [f"{int(w) // 1024}K" for w in windows]
    lines += [
        "**Summarizer calls** (brim + summarize, generated growing sessions): on the first "
        "compressed turn, per later turn (mean), and for an identical resend of the last request.",
        "",
        "| API | " + " | ".join(f"{label} first · later · resend" for label in labels) + " |",
        "|---|" + "--:|" * len(windows),
    ]
    for row in report["growth"]:
        if row["method"] != BRIM_SUMMARIZE or row["family"] != GENERATED:
            continue
        figures = []
        for w in windows:
            f = row.get(w)
            figures.append(
                "—"
                if f is None
                else f"{f['summarizer_calls_first_turn']} · "
                f"{cell(f['summarizer_calls_per_later_turn'])} · {f['resend_calls']}"
            )
        lines.append(f"| {API_LABELS[row['api']]} | " + " | ".join(figures) + " |")
    return "\n".join(lines)


def render(report: Mapping[str, Any]) -> str:
    parts = ["\n".join(header(report)), render_targets(report)]
    parts += [render_family(report, family) for family in families_of(report)]
    parts.append(render_details(report))
    return "\n\n".join(parts)
