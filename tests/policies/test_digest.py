"""Shrinking by information: the rarity scorer, a result's digest (prune's step 4) and the gist a
cleared result keeps — as pure functions, and through the policies on every wire API."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brim.policies.clear import CLEARED_PREFIX, ClearSettings, ClearToolResults, placeholder
from brim.policies.conversation import Conversation, Goal, archive_key
from brim.policies.information import (
    SHORTENED,
    CutFrom,
    cut_from,
    gist,
    is_marker,
    item_scores,
    line_scores,
    rare_keys,
    rarity_scores,
    remember_cut,
    words,
)
from brim.policies.prune import (
    CUT_DETAIL,
    PruneSettings,
    PruneToolResults,
    matched_terms,
    shortened,
)
from brim.policies.text import NAMES_LABEL, keys_of, listed_names
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires import WIRES
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.policies.test_information import BUILDERS, Item, result_of, valid
from tests.policies.test_lines import UNUSUAL, repetitive_log

use_bundled_tiktoken_files()
METER = CounterMeter(TokenCounter(), "o200k_base", "", CHAT)


class CountingMeter(CounterMeter):
    """A meter that counts the messages it measures."""

    measured = 0

    def message(self, message: Any) -> int:
        self.measured += 1
        return super().message(message)


# ---- the scorer ------------------------------------------------------------------------------


def test_words_mask_numbers_and_hashes_so_templated_lines_share_their_words() -> None:
    assert words("[00:00:11] DEBUG cache: hit for total (5785 bytes, key 178113cedb3b)") == [
        "debug",
        "cache",
        "hit",
        "for",
        "total",
        "bytes",
        "key",
    ]
    assert (
        words("test_total_12 PASSED") == words("test_total_13 PASSED") == ["test_total_0", "passed"]
    )
    assert words("v2 deadbeef größe") == ["v0", "deadbeef", "größe"]  # words with letters stay


def test_a_line_that_says_something_once_scores_above_the_template() -> None:
    lines = repetitive_log().split("\n")
    scores = line_scores(lines)
    assert max(range(len(lines)), key=scores.__getitem__) == 170
    assert scores[170] > 3 * sorted(scores)[-2]  # far above the best templated line


def test_brims_own_markers_score_below_every_line() -> None:
    lines = ["alpha beta", "[… 12 lines omitted by brim …]", "… 3 more items …", "gamma"]
    scores = line_scores(lines)
    assert scores[1] == scores[2] == -1.0 and min(scores[0], scores[3]) >= 0
    assert is_marker("[… 12 lines without task terms or errors omitted by brim …]")
    assert not is_marker("[… 12 lines of my own …]")


@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=4), max_size=12))
def test_a_piece_of_words_every_piece_has_scores_nothing(pieces: list[list[str]]) -> None:
    scores = rarity_scores([["every", *piece] for piece in pieces])
    shared = [i for i, piece in enumerate(pieces) if not piece]
    assert all(scores[i] == 0 for i in shared)
    assert all(score >= 0 for score in scores)


def test_array_outliers_are_items_with_a_field_few_others_fill() -> None:
    items: list[Any] = [{"id": n, "status": "active", "note": None} for n in range(30)]
    items[17]["note"] = "migrated by hand after the outage"
    items[4]["status"] = ""  # an empty value fills nothing: no outlier
    assert [i for i, rare in enumerate(rare_keys(items)) if rare] == [17]
    scores = item_scores(items)
    assert max(range(len(items)), key=scores.__getitem__) == 17
    assert rare_keys(items[:4]) == [False] * 4  # too few objects to call one an outlier


# ---- the digest of a JSON result ---------------------------------------------------------------


def listing(count: int = 40) -> tuple[list[dict[str, Any]], str]:
    items: list[dict[str, Any]] = [
        {"id": 10_000 + n, "name": f"order-{10_000 + n}", "status": "active", "note": None}
        for n in range(count)
    ]
    items[23]["note"] = "refunded by hand after the march outage"
    return items, orjson.dumps({"data": items, "page": 1}).decode()


def test_a_json_digest_keeps_head_tail_and_outliers_and_counts_the_rest() -> None:
    _, text = listing()
    prune = PruneToolResults(PruneSettings(digest_min_tokens=16))
    digest = orjson.loads(prune.digest_text(text, METER))
    kept = [item for item in digest["data"] if isinstance(item, dict)]
    gaps = [int(g.split()[1]) for g in digest["data"] if isinstance(g, str)]
    assert kept[0]["id"] == 10_000 and kept[-1]["id"] == 10_039
    assert any(item.get("note") for item in kept)  # the outlier
    assert len(kept) == 8 and len(kept) + sum(gaps) == 40  # about a fifth; the rest counted
    assert digest["page"] == 1
    assert prune.digest_text(text, METER) == PruneToolResults(prune.settings).digest_text(
        text, METER
    )  # the same from a fresh instance: a pure function of the text


ITEMS = st.lists(
    st.fixed_dictionaries(
        {"id": st.integers(0, 10**6), "status": st.sampled_from(["active", "failed", "paused"])},
        optional={"note": st.text(max_size=30), "owner": st.sampled_from(["ann", "bo", None])},
    ),
    min_size=20,
    max_size=60,
)


PROPERTIES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(items=ITEMS, share=st.floats(0.1, 0.5))
def test_json_digest_properties(items: list[dict[str, Any]], share: float) -> None:
    text = orjson.dumps({"data": items}).decode()
    prune = PruneToolResults(PruneSettings(digest_share=share, digest_min_tokens=16))
    digest = prune.digest_text(text, METER)
    assert len(digest) <= len(text)
    assert PruneToolResults(prune.settings).digest_text(text, METER) == digest
    kept = orjson.loads(digest)["data"]
    dicts = [item for item in kept if isinstance(item, dict)]
    gaps = [int(item.split()[1]) for item in kept if isinstance(item, str)]
    assert len(dicts) + sum(gaps) == len(items)  # every item kept or counted
    it = iter(items)
    assert all(any(item == other for other in it) for item in dicts)  # in their order
    assert dicts[0] == items[0] and dicts[-1] == items[-1]


# ---- the gist a placeholder quotes -------------------------------------------------------------


def test_a_gist_is_the_most_informative_lines_in_order_and_cut_short() -> None:
    log = repetitive_log()
    assert gist(log, 1) == (UNUSUAL,)
    assert gist(log, 0) == ()
    long = log.replace(UNUSUAL, UNUSUAL + " and more " * 40)
    (line,) = gist(long, 1)
    assert len(line) == 200 and line.endswith("…")
    _, text = listing()
    assert gist(text, 1) == ("note: refunded by hand after the march outage",)  # JSON: key: value


def test_clear_quotes_the_gist_under_an_unchanged_first_line() -> None:
    builder = BUILDERS["openai.chat"]
    log = repetitive_log()
    items = [
        builder.user("why does the build fail?"),
        *builder.turn("c1", "bash", {"command": "make"}, log),
        *builder.turn("c2", "bash", {"command": "make test"}, "ok " * 300),
        *builder.turn("c3", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    goal = Goal(target=before.total - 1, limit=before.total)
    clear = ClearToolResults(ClearSettings(keep=1, recent=0, clear_at_least=0, gist_lines=2))
    after, records = clear.apply(before, goal, builder.meter)
    cleared = result_of(after, "c1")
    first, *rest = cleared.split("\n")
    assert first == placeholder("bash", before.sizes[2], archive_key(log))  # as it always was
    assert UNUSUAL in [line.removeprefix("> ") for line in rest]
    *gist_lines, named = rest
    assert all(line.startswith("> ") for line in gist_lines) and 1 <= len(gist_lines) <= 2
    assert named.startswith(NAMES_LABEL)  # then the names the log printed
    assert records[0].tokens_after == after.sizes[2] == builder.meter.message(after.messages[2])
    assert after.total == sum(after.sizes) + after.fixed  # the accounting holds
    assert clear.apply(before, goal, builder.meter)[0].messages == after.messages  # stable
    bare = ClearToolResults(
        ClearSettings(keep=1, recent=0, clear_at_least=0, gist_lines=0, names_share=0)
    )
    assert result_of(bare.apply(before, goal, builder.meter)[0], "c1") == first
    assert valid(after)


def test_a_gist_shrinks_to_fewer_lines_where_more_would_not_save_two_thirds() -> None:
    builder = BUILDERS["openai.chat"]
    settings_of = [
        "database_host = db.internal.example",
        "database_port = 5432 for the replica",
        "cache_backend = redis cluster in eu-west",
        "queue_name = nightly exports and invoices",
        "retry_policy = exponential with jitter",
        "owner_team = billing platform on call",
        "feature_flag = checkout v2 rollout stage",
        "log_level = warning except the webhook",
        "timeout_seconds = 30 unless streaming",
        "archive_bucket = s3 cold storage tier",
    ]
    small = "\n".join(settings_of[:4])
    larger = "\n".join(f"{line} (region {n})" for n in range(3) for line in settings_of)
    items = [
        builder.user("go"),
        *builder.turn("c1", "bash", {"command": "seq"}, larger),
        *builder.turn("c2", "bash", {"command": "seq 2"}, small),
        *builder.turn("c3", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    settings = ClearSettings(keep=1, gist_lines=12, names_share=0)  # the gist alone
    after, _ = ClearToolResults(settings).apply(before, Goal(0, 0), builder.meter)
    cleared = result_of(after, "c1")
    first, *quoted = cleared.split("\n")
    quoted = [line for line in quoted if not line.startswith(NAMES_LABEL)]  # then its names
    assert 1 <= len(quoted) < 12  # fewer lines than asked for…
    assert 3 * len(cleared) <= len(larger)  # …saving two thirds of the result…
    more = "\n".join([first, *(f"> {line}" for line in gist(larger, len(quoted) + 1))])
    assert 3 * len(more) > len(larger)  # …which one more line would not
    assert quoted == [f"> {line}" for line in gist(larger, len(quoted))]
    # A result too small for its placeholder to save two thirds is worth its tokens: kept.
    assert result_of(after, "c2") == small


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_result_too_small_to_list_its_names_is_not_cleared(api: str) -> None:
    """Where saving two thirds leaves a result's names less room than `names_share` (a small
    result: its placeholder's head alone is a sizeable part of it), it is cleared only if its
    placeholder still lists every name it printed; else it is worth its tokens, kept whole:
    a small file of pins is dense in what the next step acts on."""
    builder = BUILDERS[api]
    pins = "\n".join(
        [
            "-e .[socks]  # the package itself, with its optional proxies",
            "pytest>=2.8.0,<10  # the runner the whole suite is written for",
            "pytest-cov>=4.1.0  # coverage, reported in the nightly job",
            "pytest_httpbin==2.1.0  # a local httpbin for the adapters",
            "trustme_pinned<808348  # certificates for the TLS tests",
            "wheel_builder>=0.43.0  # to build the wheel that is tested",
            "requests_toolbelt_extra>=1.0.0  # multipart helpers",
            "charset_normalizer_extra>=3.3.2  # encoding detection",
        ]
    )
    prose = " ".join(["the nightly job passed on every platform again"] * 11) + " (run 808348)"
    assert 400 < len(pins) < 600 and 400 < len(prose) < 600
    items = [
        builder.user("which pins does the test suite use?"),
        *builder.turn("c1", "read_file", {"path": "requirements-dev.txt"}, pins),
        *builder.turn("c2", "bash", {"command": "ci status"}, prose),
        *builder.turn("c3", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    goal = Goal(0, 10_000)  # as low as it goes; small results whole may take 2 000 tokens
    policy = ClearToolResults(ClearSettings(keep=1, recent=0))
    after, _ = policy.apply(before, goal, builder.meter)
    assert result_of(after, "c1") == pins  # its names would not fit: kept
    cleared = result_of(after, "c2")  # its one name fits: cleared, and listed
    assert cleared.startswith(CLEARED_PREFIX) and 3 * len(cleared) <= len(prose)
    assert cleared.split("\n")[-1] == NAMES_LABEL + "808348"
    nameless = ClearToolResults(ClearSettings(keep=1, recent=0, names_share=0))  # cleared
    assert result_of(nameless.apply(before, goal, builder.meter)[0], "c1") != pins
    assert valid(after)


def pins_file(n: int) -> str:
    """A small requirements file, its own pins in each `n`: too small for a placeholder to
    list its names."""
    return "\n".join(
        f"{package}>={n}.{k}.{7 * n + k},<{900_000 + 1000 * n + k}  # pinned for nightly run {n}"
        for k, package in enumerate(PACKAGES)
    )


PACKAGES = ["pytest", "pytest-cov", "trustme", "wheel", "httpbin", "toolbelt", "charset", "idna"]


@pytest.mark.parametrize("api", sorted(WIRES))
def test_small_results_kept_whole_take_at_most_their_share_of_the_budget(api: str) -> None:
    """Small results stay whole only while together they take at most `small_whole_share` of
    the budget, the most valuable (here the most recent) first; the others are cleared as any
    result is, their placeholders listing what names fit. (Kept without a bound, they took the
    room that deep cuts then freed by evicting larger results, whose ids only evict's notice
    keeps: facts kept at 5–10× 74.1 → 71.1 %, bench.fidelity, 2026-12-08.)"""
    builder = BUILDERS[api]
    items = [builder.user("which pins do the runs use?")]
    for n in range(1, 7):
        items += builder.turn(f"c{n}", "read_file", {"path": f"pins-{n}.txt"}, pins_file(n))
    items += builder.turn("c7", "bash", {"command": "true"}, "ok")
    before = builder.conversation(items)
    size = max(before.sizes)  # a pins file's message, the largest (each about the same)
    limit = int(2.5 * size / 0.2)  # the share holds two of them, not three
    policy = ClearToolResults(ClearSettings(keep=1, recent=0))
    after, records = policy.apply(before, Goal(0, limit), builder.meter)
    whole = [n for n in range(1, 7) if result_of(after, f"c{n}") == pins_file(n)]
    assert whole == [5, 6]
    for n in range(1, 5):
        cleared = result_of(after, f"c{n}")
        assert cleared.startswith(CLEARED_PREFIX) and NAMES_LABEL in cleared
    assert len(records) == 4 and valid(after)
    unbounded = ClearToolResults(ClearSettings(keep=1, recent=0, small_whole_share=1))
    kept_all, _ = unbounded.apply(before, Goal(0, limit), builder.meter)
    assert all(result_of(kept_all, f"c{n}") == pins_file(n) for n in range(1, 7))


@pytest.mark.parametrize("api", sorted(WIRES))
def test_where_every_older_result_cleared_reaches_the_target_all_are_cleared(api: str) -> None:
    """Twelve older results: eight cleared do not reach the low-water mark, all twelve do, and
    no grid point lies past it. All twelve are cleared and the request is at the mark — not
    eight (a multiple of eight, as where even all would not do), which left the rest to evict,
    and evict removed a whole batch of turns for it (the facts they printed with them)."""
    builder = BUILDERS[api]
    items = [builder.user("why does the nightly build fail?")]
    for n in range(12):
        log = repetitive_log(120, unusual_at=10 + n).replace("tuesdays", f"night {n}")
        items += builder.turn(f"c{n}", "bash", {"command": f"make step{n}"}, log)
    items += builder.turn("c12", "bash", {"command": "true"}, "ok")
    before = builder.conversation(items)
    policy = ClearToolResults(ClearSettings(keep=1, recent=0))
    # With no room at all every older result is cleared (the last resort takes the rest):
    # what clearing all twelve saves.
    _, every = policy.apply(before, Goal(0, 0), builder.meter)
    assert len(every) == 12
    saved = sum(record.tokens_before - record.tokens_after for record in every)
    target = before.total - saved
    goal = Goal(target, limit=before.total, grid=10 * saved)
    after, records = policy.apply(before, goal, builder.meter)
    assert len(records) == 12 and after.total <= target and valid(after)


# ---- step 4 through the policies, on every wire -------------------------------------------------


def long_session(builder: Any) -> list[Item]:
    items = [builder.user("Why does the nightly build fail?")]
    for n in range(4):
        log = repetitive_log(300, unusual_at=40 + 50 * n).replace("tuesdays", f"day {n}")
        items += builder.turn(f"c{n}", "bash", {"command": f"make step{n}"}, log)
    items += builder.turn("c9", "bash", {"command": "make last"}, repetitive_log(300))
    return items


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_cut_goes_oldest_first_only_as_far_as_the_limit_and_keeps_what_is_unusual(
    api: str,
) -> None:
    builder = BUILDERS[api]
    items = long_session(builder)
    original = copy.deepcopy(items)
    before = builder.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=2_000))

    # Only the reversible cuts are asked for: no text is cut, however far over.
    goal = Goal(target=0, limit=before.total - 6_000, reversible_only=True)
    assert prune.apply(before, goal, builder.meter)[0].messages == before.messages

    # A little over: the oldest result alone is cut, by what the limit needs and little more.
    for need in (500, 6_000):
        limit = before.total - need
        goal = Goal(target=0, limit=limit)  # the target plays no part in a cut into text
        after, records = prune.apply(before, goal, builder.meter)
        assert [r.index for r in records] == [2]
        assert {r.detail for r in records} == {CUT_DETAIL}
        assert 0.99 * limit <= after.total <= limit  # the budget used, not more than it needs

    # Far over: the oldest first, each down to its digest, the next only as far as needed.
    limit = before.total - 30_000
    after, records = prune.apply(before, Goal(target=0, limit=limit), builder.meter)
    assert [r.index for r in records] == [2, 4, 6, 8]
    assert all(r.tokens_after < 500 for r in records[:3]) and records[3].tokens_after > 2_000
    assert 0.99 * limit <= after.total <= limit
    for n in range(4):
        assert f"day {n} at 0300" in result_of(after, f"c{n}")  # the unusual line, kept
    assert result_of(after, "c9") == repetitive_log(300)  # the tool loop at hand: whole
    assert cut_from(after).texts[2, "c0"] == result_of(before, "c0")  # noted for clear
    assert prune.apply(before, Goal(0, limit), builder.meter)[0].messages == after.messages
    assert items == original
    assert valid(after)

    # Cleared afterwards, a cut result's placeholder quotes the gist of the whole result.
    cleared, _ = ClearToolResults(ClearSettings(keep=1)).apply(after, Goal(0, 0), builder.meter)
    quoted = [line for line in result_of(cleared, "c0").split("\n") if line.startswith("> ")]
    assert quoted == [f"> {line}" for line in gist(result_of(before, "c0"), 1)]
    assert "day 0 at 0300" in quoted[0]
    assert valid(cleared)


def read_output(lines: int, seed: int = 0) -> str:
    """A file as Claude Code's Read tool prints it: numbered lines, a tab, code with quotes and
    backslashes — each of which takes two characters in the JSON the request carries."""
    return "\n".join(
        f'{n:6}\t    assert parse("row {n + seed}\\tcell") == {{"key": "v{n * 7 + seed}"}}'
        for n in range(1, lines + 1)
    )


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_cut_into_escaped_text_goes_only_as_far_as_the_limit(api: str) -> None:
    """A result whose tabs, quotes and backslashes take more tokens in the request than in
    its text is cut by what its text takes there: the request uses its budget. (Cut by the
    excess counted as the text's own tokens, a Read result went out at 75 % of it.)"""
    builder = BUILDERS[api]
    items = [builder.user("read the parser")]
    for n in range(3):
        items += builder.turn(f"c{n}", "Read", {"file_path": f"/src/p{n}.py"}, read_output(600, n))
    items.append(builder.user("go on"))
    before = builder.conversation(items)
    prune = PruneToolResults()
    for need in (2_000, 8_000):
        limit = before.total - need
        after, records = prune.apply(before, Goal(target=0, limit=limit), builder.meter)
        assert {r.detail for r in records} == {CUT_DETAIL}
        assert 0.98 * limit <= after.total <= limit, (need, after.total, limit)
        assert valid(after)


def test_a_placeholder_quotes_the_gist_of_the_result_before_it_was_cut() -> None:
    builder = BUILDERS["openai.chat"]
    log = repetitive_log()
    digest = "\n".join(log.split("\n")[:40])  # a cut that lost the unusual line
    items = [
        builder.user("go"),
        *builder.turn("c1", "bash", {"command": "make"}, digest),
        *builder.turn("c2", "bash", {"command": "true"}, "ok"),
    ]
    conversation = builder.conversation(items)
    clear = ClearToolResults(ClearSettings(keep=1))
    alone = result_of(clear.apply(conversation, Goal(0, 0), builder.meter)[0], "c1")
    whole = builder.conversation(
        [*items[:2], builder.turn("c1", "bash", {"command": "make"}, log)[1]]
    )
    remember_cut(conversation, CutFrom({(2, "c1"): log}, {2: whole.sizes[2]}))
    told = result_of(clear.apply(conversation, Goal(0, 0), builder.meter)[0], "c1")
    assert alone.split("\n")[0] == placeholder("bash", conversation.sizes[2], archive_key(digest))
    # …and where prune cut it first, the placeholder names the whole: its size and its key
    assert told.split("\n")[0] == placeholder("bash", whole.sizes[2], archive_key(log))
    assert told.split("\n")[1] == f"> {UNUSUAL}"  # …quoting the whole result's gist…
    rest = told.split("\n")[2:]  # …then at most its names
    assert len(rest) <= 1 and all(line.startswith(NAMES_LABEL) for line in rest)
    assert UNUSUAL not in alone


@pytest.mark.parametrize("api", sorted(WIRES))
def test_the_newest_tool_turn_is_spared_only_while_it_is_the_task_at_hand(api: str) -> None:
    builder = BUILDERS[api]
    items = long_session(builder)
    prune = PruneToolResults(PruneSettings())
    spared, _ = prune.apply(builder.conversation(items), Goal(0, 0), builder.meter)
    assert result_of(spared, "c9") == repetitive_log(300)
    items += [builder.said("The build log is long."), builder.user("Never mind: what next?")]
    after, _ = prune.apply(builder.conversation(items), Goal(0, 0), builder.meter)
    assert "omitted by brim" in result_of(after, "c9")  # the user has moved on: history now
    assert after.messages[-1] == items[-1]
    assert valid(after)


def test_a_share_of_one_cuts_no_text_below_max_text_tokens() -> None:
    builder = BUILDERS["openai.chat"]
    before = builder.conversation(long_session(builder))
    prune = PruneToolResults(PruneSettings(digest_share=1, max_text_tokens=2_000))
    _, records = prune.apply(before, Goal(0, 0), builder.meter)
    assert [r.index for r in records] == [2, 4, 6, 8]
    assert all(1_950 <= r.tokens_after <= 2_100 for r in records)  # the cap, about


# The same answers, found with less work: the fast paths agree with the plain definitions.

LINE_TEXT = st.lists(
    st.text(alphabet="abcdef0123456789 _-./:xyzé\n", max_size=40)
    | st.sampled_from(["[… 12 lines omitted by brim …]", "… 3 more items …", UNUSUAL]),
    max_size=30,
).map("\n".join)


@given(LINE_TEXT)
@settings(max_examples=300, deadline=None)
def test_line_scores_all_at_once_equal_the_scores_line_by_line(text: str) -> None:
    lines = text.split("\n")
    plain = rarity_scores([() if is_marker(line) else words(line) for line in lines])
    expected = [
        -1.0 if is_marker(line) else score for line, score in zip(lines, plain, strict=True)
    ]
    assert line_scores(lines) == expected  # the very same sums: each line's words in one order


def test_a_line_that_comes_again_is_scored_as_every_time_it_comes() -> None:
    """Lines are read once however often they come, and counted as often as they come: a
    template's line that repeats is worth as little as its repeats make it."""
    lines = [*repetitive_log(40, 20).split("\n"), *[""] * 5, *["PASSED"] * 30, UNUSUAL, "PASSED"]
    assert line_scores(lines) == rarity_scores([words(line) for line in lines])


@given(
    st.lists(st.sampled_from(["billing", "client.py", "parse_config", "ab", "rotate"]), max_size=4),
    st.lists(
        st.sampled_from(["billing", "src/billing/client.py", "parse_config()", "xbillingx", "Ab"])
        | st.text(alphabet="ab _./-\n", max_size=12),
        max_size=600,
    ),
)
@settings(max_examples=200, deadline=None)
def test_matched_terms_are_the_terms_among_the_texts_keys(
    terms: list[str], pieces: list[str]
) -> None:
    text = " ".join(pieces)  # long enough, often, for the line-by-line path
    assert matched_terms(text, frozenset(terms)) == frozenset(terms) & keys_of(text)


def test_a_shortened_result_names_its_whole_and_json_stays_json() -> None:
    key = "0123456789abcdef" * 4
    note = "[brim shortened this result; the whole is sha256:0123456789abcdef]"
    assert shortened("line 1\n[… 9 lines omitted by brim …]", key).endswith(f"\n{note}")
    assert orjson.loads(shortened('[1,"… 8 more items …",2]', key)) == [
        1,
        "… 8 more items …",
        2,
        note,
    ]
    assert orjson.loads(shortened('{"stdout":"a"}', key)) == {"stdout": "a", "brim": note}
    # brackets that are not JSON, and an object that has a "brim" field: a last line
    assert shortened("[INFO] start\n[INFO] done]", key).endswith(f"done]\n{note}")
    assert shortened('{"brim":1}', key) == f'{{"brim":1}}\n{note}'
    # cut again on a later turn (carried forward): it keeps naming the first whole
    once = shortened("a\nb", key)
    assert shortened(once, "f" * 64) == once
    assert shortened(shortened("[1,2]", key), "f" * 64) == shortened("[1,2]", key)


def test_a_cut_that_names_its_whole_is_the_cut_shortened() -> None:
    """Prune remembers its cuts as sent, naming the whole they stand for (`shortened`); a text
    it does not cut names nothing."""
    prune = PruneToolResults(PruneSettings(max_text_tokens=200))
    key = archive_key("the whole, as the client sent it")
    log = repetitive_log()
    assert prune.digest_text(log, METER, named=key) == shortened(prune.digest_text(log, METER), key)
    assert prune.lossy_text(log, METER, named=key) == shortened(prune.lossy_text(log, METER), key)
    items = orjson.dumps([{"id": n, "name": f"item {n}"} for n in range(100)]).decode()
    named = prune.digest_text(items, METER, named=key)
    assert named == shortened(prune.digest_text(items, METER), key)
    assert orjson.loads(named)[-1] == f"{SHORTENED}{key[:16]}]"  # JSON stays JSON
    short = "a line\nand another"
    assert prune.digest_text(short, METER, named=key) == short
    assert prune.lossy_text(short, METER, named=key) == short


@pytest.mark.parametrize("api", sorted(WIRES))
def test_clear_measures_each_message_it_rewrites_once(api: str) -> None:
    """A candidate's placeholders are measured when it is made; the ones taken, put together,
    are not measured again."""
    builder = BUILDERS[api]
    items = [builder.user("Why does parse_config fail?")]
    for n in range(16):
        items += builder.turn(f"c{n}", "read_file", {"path": f"src/m{n}.py"}, repetitive_log(60, n))
    conversation = builder.conversation(items)
    meter = CountingMeter(METER.counter, "o200k_base", "gpt-4o", WIRES[api])
    clear = ClearToolResults(ClearSettings(keep=0))
    out, records = clear.apply(conversation, Goal(target=0, limit=0), meter)
    assert len(records) == 16 and meter.measured == 16
    assert valid(out)


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_placeholder_names_the_result_as_sent_whatever_prune_did_to_it_first(api: str) -> None:
    """Minified only, or cut to its relevant part: the placeholder clear makes next names the
    result's size and key as the client sent it, so it is the same either way."""
    builder = BUILDERS[api]
    rows = [{"id": f"ORD-{n}", "status": "shipped", "note": None} for n in range(300)]
    result = orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()  # minifying changes it
    items = [
        builder.user("go"),
        *builder.turn("c1", "list_orders", {}, result),
        *builder.turn("c2", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=400))
    minified, _ = prune.apply(before, Goal(target=before.total, limit=before.total), builder.meter)
    cut, _ = prune.apply(before, Goal(0, 0), builder.meter)
    assert result_of(minified, "c1") != result and result_of(cut, "c1") != result_of(minified, "c1")
    clear = ClearToolResults(ClearSettings(keep=1, gist_lines=0))
    heads = {
        result_of(clear.apply(pruned, Goal(0, 0), builder.meter)[0], "c1")
        for pruned in (minified, cut)
    }
    # The same placeholder either way but for its names line, which goes where it would not
    # save two thirds of what is sent (the 400-token cut, not the minified whole)
    listed, bare = sorted(heads, key=len, reverse=True)
    assert bare == placeholder("list_orders", before.sizes[2], archive_key(result))
    head, named = listed.split("\n")
    assert head == bare and named.startswith(f"{NAMES_LABEL}ORD-0 ORD-1 ORD-2 ")
    ids = listed_names(named.removeprefix(NAMES_LABEL))
    assert ids == [f"ORD-{n}" for n in range(len(ids))]  # as printed, each once
    assert 3 * len(listed) <= len(result_of(minified, "c1"))  # still saving two thirds


def test_a_gist_never_quotes_the_note_naming_the_whole() -> None:
    text = shortened(repetitive_log(40, unusual_at=None), "0123456789abcdef" * 4)
    assert gist(text, 3) and not any("brim shortened" in line for line in gist(text, 3))
    assert is_marker(text.split("\n")[-1])
    listing = shortened(orjson.dumps(["a", "b"]).decode(), "0123456789abcdef" * 4)
    assert not any("brim" in line for line in gist(listing, 3))


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_placeholder_lists_long_numbers_in_turn_with_the_names(api: str) -> None:
    """A cleared directory listing too long to list whole lists its file sizes (long numbers,
    in the order printed) in turn with its file names: neither crowds out the other."""
    builder = BUILDERS[api]
    listing = "\n".join(
        f"-rw-r--r-- 1 dev dev {10_000 + 37 * n:>6} Nov 28 12:00 module_{n}.py" for n in range(200)
    )
    items = [
        builder.user("which module grew?"),
        *builder.turn("c1", "bash", {"command": "ls -la"}, listing),
        *builder.turn("c2", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    after, _ = ClearToolResults(ClearSettings(keep=1)).apply(before, Goal(0, 0), builder.meter)
    named = result_of(after, "c1").split("\n")[-1]
    assert named.startswith(NAMES_LABEL)
    listed = listed_names(named.removeprefix(NAMES_LABEL))
    files = [name for name in listed if name.startswith("module_")]
    sizes = [name for name in listed if name.isdigit()]
    assert len(files) >= 10 and abs(len(files) - len(sizes)) <= 2, listed
    quoted = "\n".join(result_of(after, "c1").split("\n")[1:-1])  # its gist: not listed again
    printed = [str(10_000 + 37 * n) for n in range(200) if str(10_000 + 37 * n) not in quoted]
    assert sizes == printed[: len(sizes)]  # the first printed first
    assert len(listed) < 200 and len(named) <= len(listing) * ClearSettings().names_share


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_placeholder_lists_the_names_the_result_printed(api: str) -> None:
    """What an agent acts on next is a path, a commit, a function a result named: a cleared
    result keeps those (not its short numbers: counts, line numbers), in `names_share` of its
    size, the same every time."""
    builder = BUILDERS[api]
    log = "\n".join(
        f"{n:>5}  {sha:07x} fix the {word} path in src/itsdangerous/{word}_signer.py"
        for n, (sha, word) in enumerate(
            zip(
                range(0xA1B2C3D, 0xA1B2C3D + 60 * 4099, 4099),
                ["timed", "url", "json"] * 20,
                strict=True,
            )
        )
    )
    items = [
        builder.user("which commit broke the signer?"),
        *builder.turn("c1", "bash", {"command": "git log"}, log),
        *builder.turn("c2", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    clear = ClearToolResults(ClearSettings(keep=1))
    after, _ = clear.apply(before, Goal(0, 0), builder.meter)
    cleared = result_of(after, "c1")
    named = cleared.split("\n")[-1]
    assert named.startswith(NAMES_LABEL)
    listed = listed_names(named.removeprefix(NAMES_LABEL))
    # the most repeated names first (the three files), then commits in the order printed
    quoted = "\n".join(cleared.split("\n")[1:-1])  # a name its gist quotes is not repeated
    for path in (f"src/itsdangerous/{w}_signer.py" for w in ("timed", "url", "json")):
        assert (path in listed) != (path in quoted)
    assert "a1b3c40" in listed and not any(name.isdigit() for name in listed)
    assert len(named) <= len(log) * ClearSettings().names_share and 3 * len(cleared) <= len(log)
    assert clear.apply(before, Goal(0, 0), builder.meter)[0].messages == after.messages
    plain = ClearToolResults(ClearSettings(keep=1, names_share=0))
    assert NAMES_LABEL not in result_of(plain.apply(before, Goal(0, 0), builder.meter)[0], "c1")
    assert valid(after)


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_placeholder_lists_ids_under_one_path_once(api: str) -> None:
    """A changelog's pull-request links: written whole, a dozen tokens each, 15 % of the result
    holds a third of them; under their path, every one (and the names beside them)."""
    builder = BUILDERS[api]
    links = [f"https://github.com/acme/widgets/pull/{4100 + 7 * n}" for n in range(150)]
    log = "\n".join(
        f"- fixed the {word} parser when a value is empty ({link})"
        for word, link in zip(["csv", "json", "toml"] * 50, links, strict=True)
    )
    items = [
        builder.user("which change broke the parser?"),
        *builder.turn("c1", "read_file", {"path": "CHANGELOG.md"}, log),
        *builder.turn("c2", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)
    after, _ = ClearToolResults(ClearSettings(keep=1)).apply(before, Goal(0, 0), builder.meter)
    cleared = result_of(after, "c1")
    *_, line = cleared.split("\n")
    assert line.startswith(NAMES_LABEL) and " github.com/acme/widgets/pull/{" in line
    listed = listed_names(line.removeprefix(NAMES_LABEL))
    ids = [link.removeprefix("https://") for link in links if link not in cleared[: -len(line)]]
    assert [name for name in listed if name.startswith("github.com")] == ids  # all, in order
    assert len(line) <= len(log) * ClearSettings().names_share
    assert sum(len(name) + 1 for name in ids) > 2 * len(line)  # whole, they take far more
    assert valid(after)


@pytest.mark.parametrize("api", sorted(WIRES))
def test_where_the_same_results_still_make_the_room_they_list_more_names(api: str) -> None:
    """A shallow cut has room for names: where the results clearing takes, listing their names
    in `names_share_with_room` of their characters, still save all their batch reached (here,
    with no batch grid, the room the pass needs), their placeholders list that many. Where they
    would not, the same results are cleared with `names_share`: never one more result cleared
    for the sake of names. (With a grid, the placeholders stay the same while a session grows
    within a batch: `test_compress`'s prefix tests.)"""
    builder = BUILDERS[api]

    def log(call: str) -> str:
        return "\n".join(
            f"{n:>5}  {0xA1B2C3D + 4099 * n:07x} fix the signer in src/{call}/signer_{n}.py"
            for n in range(80)
        )

    items = [
        builder.user("which commit broke the signer?"),
        *builder.turn("c1", "bash", {"command": "git log c1"}, log("c1")),
        *builder.turn("c2", "bash", {"command": "git log c2"}, log("c2")),
        *builder.turn("c3", "bash", {"command": "true"}, "ok"),
    ]
    before = builder.conversation(items)

    def c1_cleared(share: float) -> Conversation:  # c1 alone, its names in `share` of it
        alone = ClearSettings(keep=2, recent=0, names_share=share, names_share_with_room=share)
        return ClearToolResults(alone).apply(before, Goal(0, 0), builder.meter)[0]

    wide, narrow = c1_cleared(0.3), c1_cleared(0.15)
    named = {
        name: len(result_of(cleared, "c1").split("\n")[-1])
        for name, cleared in [("wide", wide), ("narrow", narrow)]
    }
    assert 0.15 * len(log("c1")) < named["wide"] <= 0.3 * len(log("c1")), named
    assert named["narrow"] <= 0.15 * len(log("c1")), named
    clear = ClearToolResults(ClearSettings(keep=1, recent=0, clear_at_least=0, by_value=False))
    # the room c1 makes listing more names is all the room needed: it lists them
    after, _ = clear.apply(before, Goal(wide.total, wide.total), builder.meter)
    assert result_of(after, "c1") == result_of(wide, "c1")
    assert result_of(after, "c2") == log("c2") and after.total == wide.total
    # a token more: c1 still makes it with fewer names, and goes so; c2 stays whole
    after, _ = clear.apply(before, Goal(wide.total - 1, wide.total - 1), builder.meter)
    assert result_of(after, "c1") == result_of(narrow, "c1")
    assert result_of(after, "c2") == log("c2") and after.total == narrow.total
    assert valid(after)
