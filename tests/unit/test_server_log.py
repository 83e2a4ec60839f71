"""Server-log ingestion (``eval/accounting/server_log.py``, ``python -m eval.report ingest --log``) on
synthetic runs with known ground truth, and one negative test per check."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from eval import report
from eval.accounting import server_log
from eval.accounting.flops import QWEN36_27B, n_body
from scr.authors_log import LogLineError
from tests.unit.synthetic_runs import finish_line, simulate

BODY = n_body(QWEN36_27B)
POLICIES = ("radix", "exact", "scr")


def recovered(rows):
    return [(r.rid, r.conversation, r.klass, r.prompt_tokens, r.prefix_reused, r.moved, r.read, r.decode, r.blocks)
            for r in rows]


def expected(run):
    return [(t.rid, t.conversation, t.klass, t.prompt, t.reused, t.moved, t.read, t.decode, len(t.blocks))
            for t in run.truth]


def ingest(tmp_path, run, *, lines=None, client=None, **options):
    paths = run.write(tmp_path / "in")
    if lines is not None:
        paths["log"].write_text("\n".join(lines) + "\n")
    if client is not None:
        paths["client"].write_text("".join(json.dumps(record) + "\n" for record in client))
    return report.ingest(None, tmp_path / "out", log_path=paths["log"], client_path=paths["client"], **options)


def test_the_simulation_covers_what_the_checks_need():
    scr = simulate("scr")
    assert {t.klass for t in scr.truth} == {"first", "append", "edited"}
    assert any(len(t.blocks) >= 2 for t in scr.truth) and sum(t.moved for t in scr.truth) > 0
    assert any(t.reused > 0 for t in scr.truth if t.klass == "first")  # the shared system prompt
    assert all(t.moved == 0 for policy in ("radix", "exact") for t in simulate(policy).truth)
    assert [t.reused for t in simulate("radix").truth] != [t.reused for t in simulate("exact").truth]


@pytest.mark.parametrize("policy", POLICIES)
def test_log_rows_recover_the_truth(policy, tmp_path):
    run = simulate(policy)
    rows, failures = ingest(tmp_path, run)
    assert failures == []
    assert recovered(rows) == expected(run)
    assert {r.policy for r in rows} == {policy}
    for row, truth in zip(rows, run.truth):
        assert row.cached_tokens == (truth.cached if policy == "scr" else truth.reused)
        assert row.pflops == pytest.approx(2 * BODY * (truth.read + truth.decode) / 1e15, rel=1e-12)
        assert row.pflops_naive == pytest.approx(2 * BODY * (truth.prompt + truth.decode) / 1e15, rel=1e-12)
        p, f, d = truth.prompt, truth.read, truth.decode
        pairs = (p * p - (p - f) ** 2) / 2 + d * p + d * d / 2
        assert row.pflops_attn_approx == pytest.approx(row.pflops + 393_216 * pairs / 1e15, rel=1e-12)
        if policy == "scr":
            assert row.session == f"s{int(truth.conversation.rsplit('c', 1)[1]):06d}"


@pytest.mark.parametrize("policy", POLICIES)
def test_events_rows_recover_the_truth(policy, tmp_path):
    run = simulate(policy, seed=3)
    paths = run.write(tmp_path / "in")
    rows, failures = report.ingest(paths["events"], tmp_path / "out", client_path=paths["client"])
    assert failures == []
    assert [row[:-1] for row in recovered(rows)] == [row[:-1] for row in expected(run)]


def test_log_checked_against_the_events_file(tmp_path):
    run = simulate("scr", seed=1)
    paths = run.write(tmp_path / "in")
    rows, failures = report.ingest(paths["events"], tmp_path / "out", log_path=paths["log"], client_path=paths["client"])
    assert failures == [] and recovered(rows) == expected(run)
    # Read as if the server counted moved rows once: R, F shift by M, and the events disagree.
    rows, failures = report.ingest(paths["events"], tmp_path / "out", log_path=paths["log"], moved_count_in_cached=1)
    moved = [t for t in run.truth if t.moved]
    assert [f.split(":")[0] for f in failures if f.startswith("X1")] == [f"X1 {t.rid}" for t in moved]
    # Events that disagree on the blocks only.
    run.truth[-1] = dataclasses.replace(run.truth[-1], blocks=((1, 1),) * (len(run.truth[-1].blocks) + 1))
    run.write(tmp_path / "in")
    _, failures = report.ingest(paths["events"], tmp_path / "out", log_path=paths["log"])
    assert len(failures) == 1 and failures[0].startswith(f"X1 {run.truth[-1].rid}: log (P, R, M, F, D, blocks)")


def test_cli_writes_csv_and_summary(tmp_path):
    run = simulate("scr")
    paths = run.write(tmp_path / "in")
    out = tmp_path / "out"
    assert report.main(["ingest", "--log", str(paths["log"]), "--client", str(paths["client"]), "--out", str(out)]) == 0
    with open(out / "requests.csv", newline="") as f:
        table = list(csv.DictReader(f))
    for column in ("rid", "prompt_tokens", "prefix_reused", "moved", "read", "decode", "class", "pflops",
                   "pflops_naive", "pflops_attn_approx", "blocks", "cached_tokens", "session"):
        assert column in table[0]
    assert [(r["rid"], int(r["prefix_reused"]), int(r["moved"]), int(r["read"]), r["class"]) for r in table] == [
        (t.rid, t.reused, t.moved, t.read, t.klass) for t in run.truth]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks_failed"] == [] and summary["max_blocks"] == 6
    assert summary["all"]["moved"] == sum(t.moved for t in run.truth)
    assert summary["all"]["blocks"] == sum(len(t.blocks) for t in run.truth)
    assert summary["classes"]["edited"] == sum(1 for t in run.truth if t.klass == "edited")
    assert summary["pflops_per_conversation"] == pytest.approx(summary["all"]["pflops"] / 4)


def test_plain_sglang_log_without_policy_line_is_radix(tmp_path):
    run = simulate("radix")
    lines = [line for line in run.log_lines if "cache policy" not in line]
    rows, failures = ingest(tmp_path, run, lines=lines)
    assert failures == [] and {r.policy for r in rows} == {"radix"}


# ---------------------------------------------------------------------- a log from the authors' server

# Written by hand from docs/scr.md §11.1-§11.3: their banner prints Python booleans, their server
# prints no "cache policy" line, and their log holds [kvreuse] lines the accounting does not read.
AUTHORS_BANNER = (
    "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) (v5 base) "
    "v6=True pin_only=False lead_freeze=False ssm_snap=prefill_end pid=812 no_rerotate=False max_sessions=16 "
    "fastdiff=True cdc_target=64 fastdiff_min=2048 timing=False min_extend=16 t6_guard=True trace=True "
    "evict_on_fail=True evict_margin=2048 | v6.10k multiblock=1 max_blocks=6 mb_min_gap=0 splice_retry=8"
)


def authors_log(banner=AUTHORS_BANNER):
    """Two turns of one conversation; turn 2 relocates 800 + 500 rows over a 1024-token radix match."""
    return [
        "[scr] Suffix Cache Reuse on | sglang 0.5.16 (built for 0.5.16) | KVREUSE_ENABLED=1 KVREUSE_MAX_BLOCKS=6",
        "[2026-01-01 12:00:00 TP0] " + banner,
        "[2026-01-01 12:00:00 TP0] [kvreuse] v6.3: prefill-end snapshot hook attached to SchedulerBatchResultProcessor",
        "[kvreuse] kv6trace ev=req rid=a.1 sid=s000001 slot=None n_new=3000 n_old=0 nsess=1 tag='<|im_start|>syst",
        finish_line("a.1", 3000, 0, 20),
        "[kvreuse] kv6trace ev=req rid=a.2 sid=s000001 slot=0 n_new=3100 n_old=3000 nsess=1 tag='<|im_start|>syst",
        "[kvreuse] kv6trace ev=side_acq slot=0 sid=s000001 free=11",
        "[kvreuse] kv6 rid=a.2 multiblock plan: K=2 stops=[1500, 2400] reloc=[800, 500] kext=16 maxb=6 cands=3 "
        "live=3100",
        "[kvreuse] kv6 rid=a.2 phase1 radix_a=1024 chunk1=476 tail=816 total=3100 ssm_restore=True ssm_mode=fork "
        "ssm_na=False ssm_obj=True",
        "[kvreuse] v6 splice OK: rid=a.2 sid=s000001 slot=0 A+B'=1500 C'=800 extend=1600 live=3100 "
        "[spliced=1 tokens=800] blocks=1/2",
        "[kvreuse] kv6 rid=a.2 multiblock next: block 2/2 extend=[2300,2400) then splice 500 rows",
        "[kvreuse] v6 splice OK: rid=a.2 sid=s000001 slot=0 rot=-96 A+B'=2400 C'=500 extend=200 live=3100 "
        "[spliced=2 tokens=1300] blocks=2/2",
        finish_line("a.2", 3100, 1024 + 2 * 1300, 30),
    ]


@pytest.mark.parametrize("booleans", ["python", "digits"], ids=["authors-True-False", "older-port-1-0"])
def test_authors_log_is_read_as_scr_with_its_relocation(tmp_path, booleans):
    banner = AUTHORS_BANNER if booleans == "python" else AUTHORS_BANNER.replace("=True", "=1").replace("=False", "=0")
    path = tmp_path / "server.log"
    path.write_text("\n".join(authors_log(banner)) + "\n")
    rows, failures = report.ingest(None, tmp_path / "out", log_path=path)
    assert failures == []
    assert [(r.rid, r.policy, r.session, r.prompt_tokens, r.prefix_reused, r.moved, r.read, r.blocks, r.klass)
            for r in rows] == [
        ("a.1", "scr", "s000001", 3000, 0, 0, 3000, 0, "first"),
        ("a.2", "scr", "s000001", 3100, 1024, 1300, 776, 2, "edited"),
    ]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["max_blocks"] == 6


@pytest.mark.parametrize(
    "garbled",
    [
        pytest.param("[kvreuse] v6 splice OK: rid=a.2 sid=s000001 slot=0 A+B'=?? C'=500", id="splice"),
        pytest.param("[kvreuse-site] v6.10 splice-after-extend patches applied max_blocks=", id="banner"),
        pytest.param("[kvreuse] kv6trace ev=req rid=a.2 sid=s000001", id="trace-req"),
    ],
)
def test_garbled_line_the_reader_recognises_is_an_error_naming_it(tmp_path, capsys, garbled):
    lines = authors_log()
    lines.insert(6, "[2026-01-01 12:00:01 TP0] " + garbled)
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogLineError) as info:
        report.ingest(None, tmp_path / "out", log_path=path)
    assert "line 7" in str(info.value) and repr("[2026-01-01 12:00:01 TP0] " + garbled) in str(info.value)
    assert report.main(["ingest", "--log", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "line 7" in capsys.readouterr().err


# ---------------------------------------------------------------------- negative tests: each check fires


def splice_indices(run):
    return [i for i, line in enumerate(run.log_lines) if "v6 splice OK" in line]


def test_dropped_splice_line_fires(tmp_path):
    run = simulate("scr")
    lines = list(run.log_lines)
    middle = splice_indices(run)[len(splice_indices(run)) // 2]
    del lines[middle]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert any(f.startswith("L1 line ") and "a splice line is missing" in f for f in failures), failures
    assert report.main(["ingest", "--log", str(tmp_path / "in" / "server.log"), "--out", str(tmp_path / "o")]) == 1  # a failed check


def test_dropped_first_block_of_a_request_fires(tmp_path):
    run = simulate("scr")
    multi = next(t for t in run.truth if len(t.blocks) >= 2)
    lines = [line for line in run.log_lines if not (f"rid={multi.rid} " in line and "blocks=1/" in line)]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert any(f.startswith(f"L1 {multi.rid}: splice blocks 2/") for f in failures), failures


def test_dropped_last_splice_line_of_the_log_is_caught_by_the_events(tmp_path):
    run = simulate("scr")
    lines = list(run.log_lines)
    last = splice_indices(run)[-1]
    rid = server_log.parse_report_line(lines[last])["rid"]
    del lines[last]
    paths = run.write(tmp_path / "in")
    paths["log"].write_text("\n".join(lines) + "\n")
    _, failures = report.ingest(paths["events"], tmp_path / "out", log_path=paths["log"])
    assert any(f.startswith(f"X1 {rid}: log") for f in failures), failures


def test_duplicated_finish_fires(tmp_path):
    run = simulate("exact")
    lines = list(run.log_lines)
    at = next(i for i, line in enumerate(lines) if "Finish:" in line and "syn.c1.2'" in line)
    lines.insert(at + 3, lines[at])
    rows, failures = ingest(tmp_path, run, lines=lines)
    assert failures == ["L1 syn.c1.2: 2 Finish lines for one rid (rid collision or a repeated line)"]
    assert recovered(rows) == expected(run)  # the first one is kept


def test_relocated_more_than_half_of_cached_fires(tmp_path):
    run = simulate("scr")
    victim = next(t for t in run.truth if t.moved)
    lines = [finish_line(victim.rid, victim.prompt, 2 * victim.moved - 1, victim.decode)
             if "Finish:" in line and f"'{victim.rid}'" in line else line for line in run.log_lines]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert any(f.startswith(f"I1 {victim.rid}: prompt") and "reused -1 " in f for f in failures), failures


def test_foreign_request_fires(tmp_path):
    run = simulate("radix")
    lines = run.log_lines[:-1] + [finish_line("judge.q1.0", 300, 0, 20)]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert failures == ["C1 judge.q1.0: server row without a client request (foreign request)"]


def test_client_request_without_server_row_and_count_mismatch_fire(tmp_path):
    run = simulate("radix")
    client = run.client + [{"rid": "syn.c9.0", "usage": {"prompt_tokens": 5, "completion_tokens": 1}}]
    client[0] = {**client[0], "usage": {**client[0]["usage"], "prompt_tokens": client[0]["usage"]["prompt_tokens"] + 1}}
    client.append(client[1])
    _, failures = ingest(tmp_path, run, client=client)
    p = run.truth[0].prompt
    assert failures == [
        f"C1 {run.client[1]['rid']}: 2 client requests with this rid",
        f"C1 {run.truth[0].rid}: client prompt_tokens {p + 1} != server {p}",
        "C1 syn.c9.0: client request without a server row",
    ]


def test_moved_under_radix_fires(tmp_path):
    scr = simulate("scr")
    lines = [line.replace("cache policy scr started", "cache policy radix started") for line in scr.log_lines]
    _, failures = ingest(tmp_path, scr, lines=lines)
    moved = [t for t in scr.truth if t.moved]
    assert [f for f in failures if f.startswith("I3")] == [
        f"I3 {t.rid}: policy radix moved {t.moved} tokens" for t in moved]


def test_more_blocks_than_k_fires(tmp_path):
    run = simulate("scr")
    over = [t for t in run.truth if len(t.blocks) > 1]
    _, failures = ingest(tmp_path, run, max_blocks=1)
    assert failures == [f"S2 {t.rid}: {len(t.blocks)} blocks relocated > K = 1" for t in over]
    # K from the banner: a run simulated with K = 1 relocates one block per request and passes.
    assert ingest(tmp_path / "k1", simulate("scr", max_blocks=1))[1] == []


def test_k_from_the_policy_line_without_a_banner(tmp_path):
    run = simulate("scr")
    lines = [line for line in run.log_lines if "[kvreuse-site]" not in line]
    assert ingest(tmp_path, run, lines=lines)[1] == []
    assert server_log.parse_log(lines).policy_config["max_blocks"] == 6
    over = [t for t in run.truth if len(t.blocks) > 1]
    lines = [line.replace("'max_blocks': 6", "'max_blocks': 1") for line in lines]
    assert ingest(tmp_path / "k1", run, lines=lines)[1] == [
        f"S2 {t.rid}: {len(t.blocks)} blocks relocated > K = 1" for t in over]


def test_relocation_with_k_unknown_fires(tmp_path):
    run = simulate("scr")
    lines = [line.replace("'max_blocks': 6, ", "") for line in run.log_lines if "[kvreuse-site]" not in line]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert len(failures) == 1 and failures[0].startswith("S2 ") and "K is unknown" in failures[0]
    assert ingest(tmp_path / "k", run, lines=lines, max_blocks=6)[1] == []


def test_splice_line_of_an_unfinished_request_fires(tmp_path):
    run = simulate("scr")
    victim = next(t for t in run.truth if t.moved)
    lines = [line for line in run.log_lines if not ("Finish:" in line and f"'{victim.rid}'" in line)]
    _, failures = ingest(tmp_path, run, lines=lines)
    assert f"L1 {victim.rid}: {len(victim.blocks)} splice line(s) but no Finish line" in failures
    assert f"C1 {victim.rid}: client request without a server row" in failures


def test_splice_counters_restart_with_a_new_process():
    run = simulate("scr")
    first = run.log_lines[splice_indices(run)[0]]
    # The same log twice (a restarted server appending to it) is whole; counters restart at 1.
    parsed = server_log.parse_log(run.log_lines + run.log_lines)
    assert parsed.problems == [] and first
    assert len(parsed.duplicate_finishes) == len(run.truth)


def test_rows_from_log_counts_each_relocated_row_twice_in_cached_by_default(tmp_path):
    """SGLang's ``cached_tokens`` counts a relocated row twice under SCR (docs/scr.md): the
    default reads R = cached - 2 M, as the truth of the simulation has it."""
    run = simulate("scr")
    parsed = server_log.parse_log(run.write(tmp_path / "in")["log"].read_text().splitlines())
    rows = server_log.rows_from_log(parsed, BODY)
    assert [(r.rid, r.prefix_reused, r.moved) for r in rows] == [(t.rid, t.reused, t.moved) for t in run.truth]
    assert any(r.moved for r in rows)


def splice(spliced, tokens, rows, block=1, num_blocks=1):
    return {"spliced": spliced, "spliced_tokens": tokens, "relocated": rows, "line": 7, "rid": "r",
            "block": block, "num_blocks": num_blocks}


def test_a_first_splice_line_must_start_the_counters_at_one():
    """Only ``spliced=1`` with ``tokens`` equal to its own rows starts a process's counters; a line
    whose tokens equal its rows but whose count is 2 follows a missing line."""
    for item, fresh in ((splice(1, 40, 40), True), (splice(2, 40, 40), False), (splice(1, 50, 40), False)):
        problems = []
        assert server_log._step_counter(None, item, problems) == (item["spliced"], item["spliced_tokens"])
        assert (problems == []) == fresh


def test_block_order_is_not_judged_when_a_line_has_no_index():
    assert server_log._blocks_out_of_order([splice(1, 40, 40, block=None, num_blocks=2)]) is False
    assert server_log._blocks_out_of_order([splice(1, 40, 40, block=1, num_blocks=None)]) is False
    assert server_log._blocks_out_of_order([splice(1, 40, 40, block=2, num_blocks=2)]) is True
