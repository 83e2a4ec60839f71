"""The command lines of eval.bcp.run and eval.bcp.compare: usage errors (exit 2, one line),
failed checks (exit 1), complete help, and the start-up record in the manifest, against a fake
OpenAI-compatible server in a thread."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eval.bcp import compare, fixtures, run
from eval.bcp.config import DEFAULT_CONFIG
from eval.bcp.run_cli import build_parser
from policy.events import RequestEvent, startup_record

ANSWER = "Explanation: [1]\nExact Answer: Zuntor\nConfidence: 80%"


class FakeServer(BaseHTTPRequestHandler):
    """Describes itself, answers every chat at once (no tool call), and writes each rid's event."""

    events_path = None

    def log_message(self, *args):
        pass

    def _send(self, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/server_info":
            return self._send({"model_path": "/models/not-here", "version": "0.5.16", "port": 1})
        return self._send({"data": [{"id": "fake-model"}]})

    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = len(json.dumps(payload["messages"])) // 4
        event = RequestEvent(rid=payload["rid"], policy="exact", prompt_tokens=prompt, prefix_reused=0, moved=0,
                             read=prompt, decode_tokens=7, cache_salt=None, plan_resume=0, finish_reason="stop",
                             queued_ts=0.0, finished_ts=1.0)
        with open(self.events_path, "a") as f:
            f.write(json.dumps(event.to_dict()) + "\n")
        self._send({"choices": [{"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return fixtures.write_fixture(tmp_path_factory.mktemp("bcp") / "data", num_queries=2, num_docs=20, seed=1)


@pytest.fixture
def server(tmp_path):
    events = tmp_path / "events.jsonl"
    handler = type("Handler", (FakeServer,), {"events_path": events})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", events
    httpd.shutdown()
    httpd.server_close()


def run_args(dataset, url, out, events=None, *extra):
    args = ["run", "--dataset", str(dataset), "--server", url, "--policy", "exact", "--out", str(out),
            "--set", "mode=plain", "--set", "finish_policy=text", "--no-progress", *extra]
    return args + (["--events", str(events)] if events is not None else [])


def write_startup(events, policy="exact", **settings):
    config = {"piece_tokens": 832, "retain_every": 6656, "spec_drop": 0, "max_snapshots": 0, "dump_snapshots": "",
              **settings}
    events.write_text(json.dumps(startup_record(policy, config, {"sglang": "0.5.16"}, ["--cache-policy", policy],
                                                123, 1.0)) + "\n")


def test_the_startup_record_is_checked_and_copied_into_the_manifest(tmp_path, dataset, server, capsys):
    url, events = server
    write_startup(events, piece_tokens=256)
    out = tmp_path / "run"
    assert run.main(run_args(dataset, url, out, events, "--policy-set", "piece_tokens=256")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["startup"]["pid"] == 123 and manifest["startup"]["settings"]["piece_tokens"] == 256
    assert manifest["retrieval"]["snippet_unit"] == "words"  # /models/not-here is no local tokenizer
    assert [json.loads(l)["rid"].startswith("run.") for l in (out / "events.jsonl").read_text().splitlines()] == [True] * 2
    assert "warning" in capsys.readouterr().err  # the word fallback is announced


@pytest.mark.parametrize("policy, settings, message", [
    pytest.param("radix", [], "policy: the server runs 'exact', the run was told 'radix'", id="policy"),
    pytest.param("exact", ["--policy-set", "piece_tokens=512"], "setting piece_tokens", id="setting"),
])
def test_a_server_that_is_not_the_one_the_run_was_told_about_fails_the_run(tmp_path, dataset, policy, settings,
                                                                          message, capsys):
    events = tmp_path / "events.jsonl"
    write_startup(events, piece_tokens=256)
    args = run_args(dataset, "http://127.0.0.1:9", tmp_path / "run", events, *settings)
    args[args.index("--policy") + 1] = policy
    assert run.main(args) == 1
    err = capsys.readouterr().err
    assert "check failed" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing was sent, nothing written


def test_an_events_file_without_a_startup_record_warns_and_records_null(tmp_path, dataset, server, capsys):
    url, events = server
    events.write_text("")
    out = tmp_path / "run"
    assert run.main(run_args(dataset, url, out, events)) == 0
    assert json.loads((out / "manifest.json").read_text())["startup"] is None
    assert "has no start-up record" in capsys.readouterr().err


def _usage_error(capsys, argv, module=run) -> str:
    """Runs a command line that must be a usage error (exit 2) and returns its one-line message."""
    try:
        code = module.main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_usage_errors_are_one_line_with_exit_2(tmp_path, dataset, capsys):
    url = "http://127.0.0.1:9"
    line = _usage_error(capsys, run_args(dataset, url, tmp_path / "o")[:6] + ["nope", "--out", str(tmp_path / "o")])
    assert "invalid choice: 'nope'" in line and all(p in line for p in ("exact", "radix", "scr"))
    assert "no such directory" in _usage_error(capsys, run_args(tmp_path / "missing", url, tmp_path / "o"))
    (tmp_path / "empty").mkdir()
    assert "dataset:" in _usage_error(capsys, run_args(tmp_path / "empty", url, tmp_path / "o"))
    (tmp_path / "index-file").write_text("x")
    assert "--index" in _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None, "--index",
                                                      str(tmp_path / "index-file")))
    assert "has no setting 'nope'" in _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None,
                                                                    "--policy-set", "nope=1"))
    assert "agent config" in _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None, "--set", "mode=fast"))
    assert "is not a YAML value" in _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None,
                                                                  "--set", "search.k=[5"))
    for flag, value in (("--set", "mode"), ("--policy-set", "piece_tokens")):  # eval.cli_types.key_value
        line = _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None, flag, value))
        assert f"argument {flag}: '{value}': expected KEY=VALUE" in line
    assert "not a run directory" in _usage_error(capsys, ["score", "--run", str(tmp_path)])
    assert "expected NAME=DIR" in _usage_error(capsys, ["--run", str(tmp_path), "--out", str(tmp_path)], compare)
    assert not (tmp_path / "o").exists()


def _options(parser):
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            yield action
        if isinstance(action.choices, dict):  # the subcommands
            for subparser in action.choices.values():
                yield from _options(subparser)


@pytest.mark.parametrize("parser", [pytest.param(build_parser("p", "d"), id="run"),
                                    pytest.param(compare.build_parser(), id="compare")])
def test_every_option_has_help_and_shows_its_default(parser):
    for action in _options(parser):
        assert action.help, action.option_strings
        text = parser._get_formatter()._get_help_string(action)
        if action.default not in (None, False, []) and not action.required:
            assert "default" in text, action.option_strings


def test_another_run_in_the_output_directory_is_a_usage_error(tmp_path, dataset, server, capsys):
    url, events = server
    out = tmp_path / "run"
    assert run.main(run_args(dataset, url, out, None, "--limit", "1")) == 0
    line = _usage_error(capsys, run_args(dataset, url, out, None, "--limit", "1", "--set", "temperature=0"))
    assert "holds a different run" in line and "agent_config" in line


def test_render_sets_preserve_thinking_and_is_recorded_in_the_manifest(tmp_path, dataset, server, capsys):
    """--render preserve (eval/render.py) sets the config's preserve_thinking, which every request
    carries; the manifest records render, and a resume with another rendering is another run."""
    url, _ = server
    out = tmp_path / "run"
    assert run.main(run_args(dataset, url, out, None, "--limit", "1", "--render", "preserve")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["render"] == "preserve" and manifest["agent"]["config"]["preserve_thinking"] is True
    assert manifest["agent"]["chat_template_kwargs"]["preserve_thinking"] is True
    line = _usage_error(capsys, run_args(dataset, url, out, None, "--limit", "1"))
    assert "holds a different run" in line and "render" in line
    plain = tmp_path / "plain"
    assert run.main(run_args(dataset, url, plain, None, "--limit", "1")) == 0
    assert json.loads((plain / "manifest.json").read_text())["render"] == "default"


def test_render_refuses_a_set_preserve_thinking_that_says_otherwise(tmp_path, dataset, capsys):
    url = "http://127.0.0.1:9"
    line = _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None, "--render", "preserve",
                                         "--set", "preserve_thinking=false"))
    assert "--render preserve means preserve_thinking=true, but --set preserve_thinking=false" in line
    assert "invalid choice: 'keep'" in _usage_error(capsys, run_args(dataset, url, tmp_path / "o", None,
                                                                     "--render", "keep"))
    assert not (tmp_path / "o").exists()
    config = run.load_agent_config(DEFAULT_CONFIG, [("preserve_thinking", "true")])
    assert run.apply_render(config, "preserve", [("preserve_thinking", "true")]).preserve_thinking is True
    assert run.apply_render(config, None, []) is config
