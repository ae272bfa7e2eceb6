"""The llama-server proxy with real servers, real pools and the random-weight tiny GGUF.

Every proxy and server runs as its own process. Answers are greedy, so a
state that is reused correctly gives the answer a fresh server gives; a state
of the wrong model gives another one (the negative control shows that these
comparisons see it).
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="gguf is not installed: pip install 'kvcache[llama-cpp]'")

from llama_servers import Proxy, Server, call, complete, server_args

import kvcache
from kvcache.integrations.gguf_model import ModelShape, write_model
from kvcache.integrations.llama_server import identity, slotfile
from kvcache.integrations.llama_server.identity import server_settings
from kvcache.prefix import StateCache
from kvcache.prefix.states import HEAD_BYTES

CHUNK = "64"
WORDS = [
    "the",
    "system",
    "prompt",
    "says",
    "the",
    "assistant",
    "answers",
    "each",
    "question",
    "about",
    "shared",
    "memory",
]


def text(seed: int, num_words: int) -> str:
    """A prompt of ``num_words`` vocabulary words, different for each seed."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(num_words))


SYSTEM = text(1, 300)  # about 600 tokens: ten 64-token chunks


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model, and one of the same shape with other weights."""
    folder = tmp_path_factory.mktemp("models")
    return (
        write_model(folder / "tiny.gguf", ModelShape()),
        write_model(folder / "other.gguf", ModelShape(seed=1)),
    )


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    return make_pool("64M")


def test_a_restarted_server_finds_the_prompt_warm(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    args = server_args(models[0])
    fresh = Server(args, tmp_path / "fresh.log")
    try:
        want = complete(fresh.url, SYSTEM + " question one")["tokens"]
        want_two = complete(fresh.url, SYSTEM + " question two")["tokens"]
    finally:
        fresh.stop()
    first = Proxy(pool.name, args, tmp_path / "first.log", "--chunk-tokens", CHUNK)
    try:
        cold = complete(first.url, SYSTEM + " question one")
        assert cold["tokens"] == want and cold["timings"]["cache_n"] == 0
        assert first.wait_saved(1)["counts"]["saved"] == 1
    finally:
        assert first.stop() == 0
    second = Proxy(pool.name, args, tmp_path / "second.log", "--chunk-tokens", CHUNK)
    try:
        warm = complete(second.url, SYSTEM + " question one")
        total = warm["timings"]["cache_n"] + warm["timings"]["prompt_n"]
        assert warm["tokens"] == want
        assert warm["timings"]["cache_n"] == total - 1  # all but the last token, from the pool
        other = complete(second.url, SYSTEM + " question two")  # the slot holds it now
        assert other["tokens"] == want_two and other["timings"]["cache_n"] >= total - 4
        stats = second.wait_saved(2)
    finally:
        second.stop()
    assert stats["counts"]["restored"] == 1
    assert stats["problems"] == {}


def test_two_servers_share_a_pool(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    args = server_args(models[0])
    one = Proxy(pool.name, args, tmp_path / "one.log", "--chunk-tokens", CHUNK)
    two = Proxy(pool.name, args, tmp_path / "two.log", "--chunk-tokens", CHUNK)
    try:
        cold = complete(one.url, SYSTEM + " question one")
        one.wait_saved(1)
        warm = complete(two.url, SYSTEM + " question one")
        partial = complete(two.url, SYSTEM + " a question of another kind", cache_prompt=True)
        assert warm["tokens"] == cold["tokens"]
        assert cold["timings"]["cache_n"] == 0
        assert warm["timings"]["prompt_n"] == 1  # all but the last token, from the pool
        assert partial["timings"]["cache_n"] >= 590  # the shared system prompt
        assert two.wait_saved(2)["counts"]["restored"] == 1
    finally:
        one.stop()
        two.stop()


def test_several_slots_serve_concurrent_clients(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    """Six clients at once on three slots, twice: each answer is the one a fresh server
    gives the same prompt alone.

    Seed 4 is left out of the prompts: its "question 1" has a near tie (log-probabilities
    -0.764 and -0.773 for its first token), and a plain llama-server picks the other token
    once it reuses the prefix from its slot's "question 2" (other batches, other last bits
    of the sums). Seeds 2 to 11 but 4 give the fresh answer in either order.
    """
    args = [*server_args(models[0], context=4096, slots=3), "-kvu"]
    prompts = [text(seed, 200) + f" question {i}" for seed in (2, 3, 5) for i in (1, 2)]
    fresh = Server(server_args(models[0]), tmp_path / "fresh.log")
    try:
        want = [complete(fresh.url, prompt)["tokens"] for prompt in prompts]
    finally:
        fresh.stop()
    proxy = Proxy(pool.name, args, tmp_path / "proxy.log", "--chunk-tokens", CHUNK)
    try:
        with ThreadPoolExecutor(len(prompts)) as clients:
            first = list(clients.map(lambda p: complete(proxy.url, p), prompts))
            proxy.wait_saved(len(prompts))
            second = list(clients.map(lambda p: complete(proxy.url, p), prompts))
        stats = proxy.wait_saved(2 * len(prompts))
    finally:
        proxy.stop()
    assert [answer["tokens"] for answer in first] == want
    assert [answer["tokens"] for answer in second] == want
    for answer in second:  # each found its prefix: in its slot, or restored from the pool
        assert answer["timings"]["cache_n"] >= 390
    assert stats["problems"] == {}
    assert stats["counts"]["saved"] == 2 * len(prompts)


def test_a_same_shape_model_never_reuses_anothers_states(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    right, wrong = models
    first = Proxy(pool.name, server_args(right), tmp_path / "right.log", "--chunk-tokens", CHUNK)
    try:
        complete(first.url, SYSTEM + " question one")
        first.wait_saved(1)
    finally:
        first.stop()
    fresh = Server(server_args(wrong), tmp_path / "fresh.log")
    try:
        want = complete(fresh.url, SYSTEM + " question one")["tokens"]
    finally:
        fresh.stop()
    proxy = Proxy(pool.name, server_args(wrong), tmp_path / "wrong.log", "--chunk-tokens", CHUNK)
    try:
        answer = complete(proxy.url, SYSTEM + " question one")
        stats = proxy.wait_saved(1)
    finally:
        proxy.stop()
    assert answer["timings"]["cache_n"] == 0 and answer["tokens"] == want
    assert stats["counts"].get("restored", 0) == 0

    # The negative control: the right model's state, put into the wrong model's slot by
    # hand, restores without complaint and is reused -- and the answer differs.
    records = [k for k in pool if ":t" in str(k)]
    assert records
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    value = pool.get(records[0])
    num_tokens = int.from_bytes(value[8:16], "little")
    (slot_dir / "theirs.bin").write_bytes(value[HEAD_BYTES + 8 * num_tokens :])
    assert slotfile.read_tokens((slot_dir / "theirs.bin").read_bytes()) is not None
    control = Server(
        server_args(wrong), tmp_path / "control.log", "--slot-save-path", str(slot_dir)
    )
    try:
        status, _, body = call(control.url, "/slots/0?action=restore", {"filename": "theirs.bin"})
        assert status == 200, body
        reused = complete(control.url, SYSTEM + " question one", id_slot=0)
    finally:
        control.stop()
    assert reused["timings"]["cache_n"] > 500
    assert reused["tokens"] != want


def test_a_server_killed_mid_save_fails_no_request(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    args = server_args(models[0])
    fresh = Server(args, tmp_path / "fresh.log")
    try:
        want = [complete(fresh.url, SYSTEM + f" question {i}")["tokens"] for i in range(4)]
    finally:
        fresh.stop()
    proxy = Proxy(pool.name, args, tmp_path / "proxy.log", "--chunk-tokens", CHUNK)
    try:
        for i, delay_s in enumerate((0.0, 0.002, 0.01)):
            answer = complete(proxy.url, SYSTEM + f" question {i}")
            assert answer["tokens"] == want[i]
            pid = proxy.stats()["server_pid"]
            time.sleep(delay_s)
            subprocess.run(["kill", "-KILL", str(pid)], check=True)  # as the save runs, or near
            # the next request waits for the restarted server and is answered right (its
            # tokens may be unknown, and it uncached, if it came as the server died)
            assert complete(proxy.url, SYSTEM + f" question {i + 1}")["tokens"] == want[i + 1]
        stats = proxy.stats()
    finally:
        proxy.stop()
    assert stats["counts"]["requests"] == 6
    assert pool.check() == []
    for key in pool:  # every state left in the pool is whole
        value = pool.get(key)
        if ":t" in str(key):
            num_tokens = int.from_bytes(value[8:16], "little")
            assert slotfile.read_tokens(value[HEAD_BYTES + 8 * num_tokens :]) is not None


def _steady(body: bytes) -> bytes:
    """A completion's bytes with what differs between runs (ids, clocks, speeds) blanked."""
    body = re.sub(rb'"(id|created)":("[^"]*"|\d+)', rb'"\1":0', body)
    return re.sub(rb'"timings":\{[^}]*\}', rb'"timings":{}', body)


def test_streams_pass_through_byte_for_byte(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    args = server_args(models[0])
    request = {
        "messages": [{"role": "user", "content": "what is shared memory"}],
        "max_tokens": 12, "temperature": 0.0, "seed": 0, "stream": True,
    }  # fmt: skip
    direct = Server(args, tmp_path / "direct.log")
    try:
        want = [call(direct.url, "/v1/chat/completions", request)[2] for _ in range(2)]
        want_models = call(direct.url, "/v1/models")
        want_bad = call(direct.url, "/completion")
    finally:
        direct.stop()
    proxy = Proxy(pool.name, args, tmp_path / "proxy.log", "--chunk-tokens", CHUNK)
    try:
        status, headers, got = call(proxy.url, "/v1/chat/completions", request)
        other = call(proxy.url, "/v1/chat/completions", {**request, "max_tokens": 11})[2]
        models = call(proxy.url, "/v1/models")
        bad = call(proxy.url, "/completion")  # a GET the server does not serve
        proxy.wait_saved(2)
    finally:
        proxy.stop()
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert _steady(want[0]) == _steady(want[1])  # the blanking leaves runs comparable
    assert got.count(b"data: ") > 5 and got.endswith(b"data: [DONE]\n\n")
    assert _steady(got) == _steady(want[0])
    assert _steady(other) != _steady(want[0])  # negative control: one token fewer shows
    assert models[0] == 200 and _steady(models[2]) == _steady(want_models[2])
    assert bad[0] == want_bad[0] != 200 and bad[2] == want_bad[2]


def test_a_missing_pool_serves_requests_uncached(
    models: tuple[Path, Path], pool_name: str, tmp_path: Path
) -> None:
    proxy = Proxy(pool_name, server_args(models[0]), tmp_path / "proxy.log")
    try:
        answers = [complete(proxy.url, SYSTEM)["tokens"] for _ in range(2)]
        stats = proxy.wait_saved(2)
    finally:
        proxy.stop()
    assert answers[0] == answers[1]
    assert stats["problems"]["pool_unavailable"] == 1
    assert "the pool cannot be opened" in (tmp_path / "proxy.log").read_text()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--listen", "nowhere"], "--listen must be HOST:PORT"),
        (["--upstream", "http://127.0.0.1:9"], "--upstream and --slot-dir go together"),
        (["--upstream", "http://127.0.0.1:9", "--slot-dir", "OPEN"], "is open to other users"),
        (["--slot-dir", "/nonexistent"], "--upstream and --slot-dir go together"),
        (["--server-bin", "/nonexistent/llama-server", "--", "-m", "x"], "no llama-server"),
        (["--", "-m", "x", "--port", "80"], "leave --port to the proxy"),
    ],
)
def test_bad_command_lines_get_one_line(options: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o755)
    options = [str(tmp_path / "open") if o == "OPEN" else o for o in options]
    command = [sys.executable, "-m", "kvcache", "llama-server", "--pool", "p", *options]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_chat_prompts_are_tokenized_by_the_servers_template(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    args = server_args(models[0])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    request = {"messages": messages, "max_tokens": 6, "temperature": 0.0, "seed": 0}
    first = Proxy(pool.name, args, tmp_path / "first.log", "--chunk-tokens", CHUNK)
    try:
        cold = json.loads(call(first.url, "/v1/chat/completions", request)[2])
        first.wait_saved(1)
    finally:
        first.stop()
    second = Proxy(pool.name, args, tmp_path / "second.log", "--chunk-tokens", CHUNK)
    try:
        warm = json.loads(call(second.url, "/v1/chat/completions", request)[2])
        stats = second.wait_saved(1)
    finally:
        second.stop()
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert warm["timings"]["cache_n"] > 500 and warm["timings"]["prompt_n"] == 1
    assert stats["counts"]["restored"] == 1 and stats["problems"] == {}


@pytest.mark.parametrize(
    ("made_with", "cut"),
    [
        pytest.param(["-ctk", "f32"], False, id="another-kv-type-refused"),
        pytest.param([], True, id="truncated-aborts-the-server"),
    ],
)
def test_a_state_the_server_cannot_load_costs_only_the_cache(
    models: tuple[Path, Path],
    pool: kvcache.Pool,
    tmp_path: Path,
    made_with: list[str],
    cut: bool,
) -> None:
    """A stored state the server refuses (HTTP 400), or that makes it abort (a truncated
    file trips a GGML_ASSERT in this llama.cpp), filed under the proxy's own keys."""
    args = server_args(models[0])
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    plain = Server(args, tmp_path / "plain.log", "--slot-save-path", str(slot_dir), *made_with)
    try:
        want = complete(plain.url, SYSTEM + " question one")["tokens"]
        status, _, body = call(plain.url, "/slots/0?action=save", {"filename": "s.bin"})
        assert status == 200, body
    finally:
        plain.stop()
    saved = (slot_dir / "s.bin").read_bytes()
    tokens = slotfile.read_tokens(saved)
    assert tokens is not None and len(tokens) > 600
    if cut:
        head = 12 + 4 * (len(tokens) + 4)
        saved = saved[: head + (len(saved) - head) // 2]  # whole tokens, half the KV
    proxy = Proxy(pool.name, args, tmp_path / "proxy.log", "--chunk-tokens", CHUNK)
    try:
        # filed under the keys the proxy uses for this model and these options
        layout = identity.layout(json.loads(call(proxy.url, "/props")[2]), server_settings(args))
        states = StateCache(pool, identity.model_digest(models[0]), layout, chunk_tokens=64)
        states.put(tokens, [saved])
        errors_before = pool.stats().errors
        answer = complete(proxy.url, SYSTEM + " question one")
        stats = proxy.wait_saved(1)
    finally:
        proxy.stop()
    assert answer["tokens"] == want and answer["timings"]["cache_n"] == 0
    assert set(stats["problems"]) == {"restore_refused"}
    assert stats["counts"].get("restored", 0) == 0 and stats["counts"]["saved"] == 1
    assert pool.stats().errors == errors_before + stats["problems"]["restore_refused"]
    assert "refused a stored state" in (tmp_path / "proxy.log").read_text()


def test_proxies_fronting_running_servers_share_a_pool(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    """--upstream: servers the user runs, each with its own private slot folder."""
    args = server_args(models[0])
    servers, proxies = [], []
    try:
        for name in ("a", "b"):
            slots = tmp_path / f"slots-{name}"
            slots.mkdir(mode=0o700)
            server = Server(args, tmp_path / f"{name}.log", "--slot-save-path", str(slots))
            servers.append(server)
            options = ("--upstream", server.url, "--slot-dir", str(slots), "--chunk-tokens", CHUNK)
            proxies.append(Proxy(pool.name, [], tmp_path / f"proxy-{name}.log", *options))
        cold = complete(proxies[0].url, SYSTEM + " question one")
        proxies[0].wait_saved(1)
        warm = complete(proxies[1].url, SYSTEM + " question one")
        stats = proxies[1].wait_saved(1)
        leftovers = [list(path.iterdir()) for path in tmp_path.glob("slots-*")]
    finally:
        for process in proxies + servers:
            process.stop()
    assert warm["tokens"] == cold["tokens"] and warm["timings"]["prompt_n"] == 1
    assert stats["counts"]["restored"] == 1 and stats["problems"] == {}
    assert leftovers == [[], []]  # no slot file outlives its restore or save


def test_a_client_that_leaves_mid_stream_frees_its_slot(
    models: tuple[Path, Path], pool: kvcache.Pool, tmp_path: Path
) -> None:
    proxy = Proxy(pool.name, server_args(models[0]), tmp_path / "proxy.log")
    try:
        host, port = proxy.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        body = {"prompt": SYSTEM, "n_predict": 2000, "stream": True, "temperature": 0.0}
        connection.request("POST", "/completion", json.dumps(body))
        answer = connection.getresponse()
        assert answer.status == 200 and answer.read1(100).startswith(b"data: ")
        connection.close()  # gone before the answer's end
        again = complete(proxy.url, SYSTEM + " question one")  # the one slot is free again
        stats = proxy.stats()
    finally:
        proxy.stop()
    assert again["tokens"] and stats["counts"]["requests"] == 2
    assert stats["counts"]["incomplete"] == 1  # seen, and not saved


def test_a_killed_proxy_leaves_no_server_behind(models: tuple[Path, Path], tmp_path: Path) -> None:
    proxy = Proxy("no-such-pool", server_args(models[0]), tmp_path / "proxy.log")
    server_pid = proxy.stats()["server_pid"]
    command = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")
    slot_dir = Path(command[command.index(b"--slot-save-path") + 1].decode())
    proxy.stop(signal.SIGKILL)  # no chance to stop it, nor to remove its slot folder
    shutil.rmtree(slot_dir)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{server_pid}").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{server_pid}/stat").read_text().split()[2] == "Z":
            break  # ended, waiting for the init process to reap it
        time.sleep(0.05)
    stat = Path(f"/proc/{server_pid}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"
