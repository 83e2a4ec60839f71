"""eval.cluster's pure parts: the routing key, who served what, split conversations, the router's
argv, the bench's table and failure rules, and eval.report's merge of per-worker events."""

from __future__ import annotations

import json

import pytest

from eval.cluster.affinity import (ROUTING_HEADER, affinity_branches, affinity_headers, load, manual_branches,
                                   routing_key, served_by, split_conversations, workers_per_conversation)
from eval.cluster.bench import failed, max_gap_points, table
from eval.cluster.cluster import router_command


@pytest.mark.parametrize("rid, key", [
    ("bench.q3.7", "bench.q3"),
    ("run.conv-a.0", "run.conv-a"),
    ("run.a.b.12", "run.a.b"),  # only the last part is the turn
    ("plain", "plain"),
])
def test_routing_key_drops_the_turn(rid, key):
    assert routing_key(rid) == key


def test_affinity_headers_name_the_conversation():
    assert affinity_headers({"rid": "r.c1.4", "input_ids": [1]}) == {ROUTING_HEADER: "r.c1"}
    assert affinity_headers({"input_ids": [1]}) == {}
    assert affinity_headers({"rid": ""}) == {}


EVENTS = {
    "worker-0": [{"record": "startup"}, {"rid": "r.a.0"}, {"rid": "r.a.1"}, {"rid": "HEALTH_CHECK_ab"},
                 {"rid": "r.c.0"}],
    "worker-1": [{"rid": "r.b.0"}, {"rid": "r.b.1"}, {"rid": "r.c.1"}, {"rid": "HEALTH_CHECK_cd"}],
}


def test_served_by_skips_health_checks_and_start_up_records():
    where = served_by(EVENTS)
    assert where == {"r.a.0": "worker-0", "r.a.1": "worker-0", "r.c.0": "worker-0",
                     "r.b.0": "worker-1", "r.b.1": "worker-1", "r.c.1": "worker-1"}


def test_a_call_served_twice_is_an_error():
    with pytest.raises(ValueError, match="r.a.0"):
        served_by({"worker-0": [{"rid": "r.a.0"}], "worker-1": [{"rid": "r.a.0"}]})


def test_split_conversations_and_load():
    where = served_by(EVENTS)
    assert workers_per_conversation(where) == {"r.a": ["worker-0"], "r.b": ["worker-1"],
                                                "r.c": ["worker-0", "worker-1"]}
    assert split_conversations(where) == ["r.c"]
    assert load(where, ["worker-0", "worker-1", "worker-2"]) == {
        "worker-0": {"calls": 3, "conversations": 2}, "worker-1": {"calls": 3, "conversations": 2},
        "worker-2": {"calls": 0, "conversations": 0}}


def test_router_command_is_loopback_with_its_own_metrics_port():
    cmd = router_command(4000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "manual", 4001)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    text = " ".join(cmd)
    assert "--host 127.0.0.1 --port 4000" in text
    assert "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2 --policy manual" in text
    assert "--prometheus-host 127.0.0.1 --prometheus-port 4001" in text
    assert "--assignment-mode min_group" in text  # new conversations go to the worker with the fewest
    assert "--assignment-mode" not in " ".join(router_command(4000, ["http://127.0.0.1:1"], "cache_aware", 4001))


@pytest.mark.parametrize("policy, workers, message", [
    ("sticky", ["http://127.0.0.1:1"], "router policy 'sticky'"),
    ("manual", [], "at least one worker"),
])
def test_router_command_refuses(policy, workers, message):
    with pytest.raises(ValueError, match=message):
        router_command(1, workers, policy, 2)


def _shares(values):
    return dict(zip(("prefix_reused_share", "moved_share", "read_share"), values))


def _arm(shares, replay_s, **extra):
    return {"shares": _shares(shares), "replay_s": replay_s, "checks_failed": [], **extra}


def _results(cluster_shares=(0.5, 0.2, 0.3), split=(), equal=10, lost=(), policy="exact",
             predicted=(0.5, 0.2, 0.3), branches=None):
    exact = policy == "exact"
    single = _arm((0.5, 0.2, 0.3), 100.0, policy=policy,
                  **({"exact_prediction": {"equal": 10, "calls": 10}} if exact else {}))
    cluster = _arm(cluster_shares, 80.0, policy=policy, router_policy="manual", split_conversations=list(split),
                   conversations=4, load={"worker-0": {"calls": 6}, "worker-1": {"calls": 4}},
                   lost_calls=list(lost), predicted_shares=_shares(predicted), router_branches=branches,
                   **({"exact_prediction": {"equal": equal, "calls": 10}} if exact else {}))
    return {policy: {"single": single, "2w-manual": cluster}}


def test_gap_in_points():
    assert max_gap_points({"prefix_reused_share": 0.5, "moved_share": 0.2, "read_share": 0.3},
                          {"prefix_reused_share": 0.48, "moved_share": 0.2, "read_share": 0.32}) == pytest.approx(2.0)


@pytest.mark.parametrize("kwargs, problem", [
    ({}, None),
    ({"split": ["r.c"]}, "conversations split"),
    ({"equal": 9}, "differs from its prediction"),
    ({"lost": ["r.c.3"]}, "1 calls lost"),
    # exact: 2 points from the single server but every call as predicted per worker: a pass
    ({"cluster_shares": (0.48, 0.2, 0.32), "predicted": (0.48, 0.2, 0.32)}, None),
    ({"cluster_shares": (0.48, 0.2, 0.32), "predicted": (0.48, 0.2, 0.32), "policy": "radix"}, None),
    ({"cluster_shares": (0.48, 0.2, 0.32), "policy": "radix"}, "more than 1 point from the prediction"),
    ({"cluster_shares": (0.48, 0.2, 0.32), "predicted": (0.489, 0.2, 0.311), "policy": "scr"}, None),  # 0.9 points
    ({"branches": {"vacant": 4, "occupied_hit": 6}}, None),
    ({"branches": {"vacant": 4, "occupied_hit": 5, "no_routing_id": 1}}, "1 calls reached the router without"),
])
def test_failed_rules(kwargs, problem):
    problems = failed(_results(**kwargs))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_cache_aware_splits_are_measured_not_failed():
    results = _results(split=["r.c"])
    results["exact"]["2w-manual"]["router_policy"] = "cache_aware"
    assert failed(results) == []


def test_table_cells():
    text = table(_results(split=["r.c"]), 10)
    assert "| conversations split across workers |  | 1/4 |" in text
    assert "| calls per worker |  | 6 / 4 |" in text
    assert "| exact: calls equal to exact_cache.replay (per worker) | 10/10 | 10/10 |" in text
    assert "| largest share gap to prediction, points |  | 0.00 |" in text
    assert "| throughput ratio to single | 1.00 | 1.25 |" in text
    assert "| prefix / moved / read | 50.0% / 20.0% / 30.0% |" in text


def _event(rid, finished, prompt=10):
    from policy.events import RequestEvent

    return RequestEvent(rid=rid, policy="exact", prompt_tokens=prompt, prefix_reused=0, moved=0, read=prompt,
                        decode_tokens=1, cache_salt=None, plan_resume=0, finish_reason="length",
                        queued_ts=finished - 1, finished_ts=finished).to_dict()


def test_report_merges_worker_events_in_finishing_order(tmp_path):
    from eval.report import ingest, merged_events

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(e) for e in [{"record": "startup", "policy": "exact"}, _event("r.x.0", 1.0), _event("r.x.1", 3.0)]))
    b.write_text(json.dumps(_event("r.y.0", 2.0)) + "\n")
    assert [e.rid for e in merged_events([a, b])] == ["r.x.0", "r.y.0", "r.x.1"]
    rows, failures = ingest([a, b], tmp_path / "out")
    assert failures == [] and len(rows) == 3
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["sources"]["events"] == [str(a), str(b)]


def test_report_refuses_a_rid_in_two_worker_files(tmp_path):
    from eval.report import merged_events

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(_event("r.x.0", 1.0)) + "\n")
    b.write_text(json.dumps(_event("r.x.0", 2.0)) + "\n")
    with pytest.raises(ValueError, match="r.x.0"):
        merged_events([a, b])


def test_for_router_moves_forced_ids_into_the_kept_field():
    from eval.cluster.router_client import for_router
    from serving.forced import unwrap_envelope

    payload = {"rid": "r.c.2", "input_ids": [1, 2], "extra_key": "s",
               "sampling_params": {"max_new_tokens": 2, "custom_params": {"forced_output_ids": [7, 8], "x": 1}}}
    body, headers = for_router(payload, affinity=True)
    assert headers == {ROUTING_HEADER: "r.c"}
    assert unwrap_envelope(body["custom_logit_processor"]) == [7, 8]
    assert body["sampling_params"] == {"max_new_tokens": 2, "custom_params": {"x": 1}}
    assert body["extra_key"] == "s" and body["rid"] == "r.c.2"
    assert payload["sampling_params"]["custom_params"]["forced_output_ids"] == [7, 8]  # the caller's is untouched
    plain = {"rid": "r.c.0", "sampling_params": {"max_new_tokens": 1}}
    assert for_router(plain, affinity=False) == (plain, None)
    only_forced = {"sampling_params": {"custom_params": {"forced_output_ids": [3]}}}
    assert for_router(only_forced, affinity=False)[0] == {"sampling_params": {}, "custom_logit_processor": '{"forced_output_ids":[3]}'}


@pytest.mark.parametrize("cores, workers, shares", [
    ([0, 1], 2, [[0], [1]]),
    (range(8), 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (range(5), 2, [[0, 1], [2, 3]]),  # the spare core is left out
    ([3, 1], 1, [[1, 3]]),
    ([0], 2, [None, None]),  # fewer cores than workers: no pinning
])
def test_core_shares(cores, workers, shares):
    from eval.cluster.cluster import core_shares

    assert core_shares(cores, workers) == shares


def _startup(policy="exact", **settings):
    return {"record": "startup", "policy": policy, "settings": settings, "versions": {}, "server_args": [],
            "pid": 1, "ts": 0.0}


@pytest.mark.parametrize("records, policy, problems", [
    ([_startup()], "exact", []),
    ([_startup()], None, []),
    ([_startup("scr")], "exact", ["policy: the server runs 'scr', the run was told 'exact'"]),
    ([_startup(piece_tokens=64), _startup(piece_tokens=64)], "exact", []),
    ([_startup(piece_tokens=64), _startup(piece_tokens=832)], "exact", ["different policies or settings"]),
    ([None], "exact", []),  # a server from before start-up records
])
def test_report_checks_start_up_records(tmp_path, records, policy, problems):
    from eval.report import ingest

    paths = []
    for i, record in enumerate(records):
        path = tmp_path / f"w{i}.jsonl"
        lines = ([json.dumps(record)] if record else []) + [json.dumps(_event(f"r.c{i}.0", 1.0 + i))]
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    rows, failures = ingest(paths, tmp_path / "out", policy=policy)
    assert len(failures) == len(problems)
    for failure, problem in zip(failures, problems):
        assert failure.startswith("S1") and problem in failure
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["startup"] == {str(p): r for p, r in zip(paths, records)}


def test_trace_sizes_round_the_context_and_sum_the_pool():
    from eval.bench_policies import trace_sizes
    from eval.traces.format import TraceCall

    calls = [TraceCall("a", 0, [1] * 9000, [2] * 100), TraceCall("a", 1, [1] * 100, [])]
    assert trace_sizes(calls) == (9216, 9200 + 9216)  # 9,100 + 64 rounded up to a multiple of 1,024
    assert trace_sizes([TraceCall("b", 0, [1] * 10, [2])]) == (8192, 11 + 8192)  # at least 8,192


METRICS = """# HELP smg_manual_policy_branch_total Manual policy execution branches
# TYPE smg_manual_policy_branch_total counter
smg_manual_policy_branch_total{branch="vacant"} 4
smg_manual_policy_branch_total{branch="occupied_hit"} 8
smg_manual_policy_branch_total{branch="occupied_miss"} 0
smg_manual_policy_cache_entries 4
smg_manual_policy_branch_totals{branch="vacant"} 99
smg_worker_health{worker="http://127.0.0.1:1"} 1
"""


def test_manual_branches_reads_the_counter_only():
    assert manual_branches(METRICS) == {"vacant": 4, "occupied_hit": 8}
    assert manual_branches("") == {}
    assert manual_branches("smg_worker_health 1\n") == {}


def test_manual_branches_sums_label_sets_and_reads_float_values():
    text = ('smg_manual_policy_branch_total{model="m",branch="occupied_hit"} 3\n'
            'smg_manual_policy_branch_total{branch="occupied_hit",model="n"} 2.0 1700000000\n')
    assert manual_branches(text) == {"occupied_hit": 5}


@pytest.mark.parametrize("conversations, calls, branches", [
    (4, 12, {"vacant": 4, "occupied_hit": 8}),
    (1, 1, {"vacant": 1}),
])
def test_affinity_branches(conversations, calls, branches):
    assert affinity_branches(conversations, calls) == branches
