"""`trialforge serve lm`: real server processes over the tiny random GPT-2 of conftest (no chat template) and a
copy of it whose chat template renders tools, asked over HTTP as vLLM would be.

What a trainer relies on is checked against the model itself: the prompt's token ids are what HFPolicy encodes,
the log-probabilities those of a forward pass at the temperature, an adapter's those of peft's own model, and
new weights pushed from disk are the ones that answer.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import select
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from trialforge.inference.server import assistant_message, tools_note
from trialforge.rollout.env import TOOLS
from trialforge.rollout.hf_policy import HFPolicy

MAX_NEW = 40
SYSTEM = "You fix bugs."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "add() subtracts"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "view", "arguments": '{"path": "a.py"}'}}
HISTORY = [
    *MESSAGES,
    {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "1  def add(a, b):"},
]
# A Hermes-style template: tool schemas in the system turn, calls as <tool_call> JSON, answers as tool turns.
TOOL_TEMPLATE = (
    "[system]{{ messages[0].content }}{% for t in tools or [] %}\n{{ t | tojson }}{% endfor %}"
    "{% for m in messages[1:] %}[{{ m.role }}]{{ m.content }}{% for c in m.tool_calls or [] %}"
    '<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


@dataclass
class Server:
    name: str
    url: str  # http://HOST:PORT/v1
    http: httpx.Client  # based at url

    def update_weights(self, path: Path) -> httpx.Response:
        """SGLang's route, at the root (not under /v1)."""
        return httpx.post(self.url.removesuffix("/v1") + "/update_weights_from_disk", json={"model_path": str(path)})

    def chat(self, **body: Any) -> httpx.Response:
        return self.http.post("/chat/completions", json={"model": self.name, "messages": MESSAGES, **body})

    def reply(self, **body: Any) -> dict[str, Any]:
        answer = self.chat(**body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def sample(self, **body: Any) -> tuple[list[int], list[int], list[float]]:
        """prompt ids, sampled ids, their log-probabilities."""
        data = self.reply(logprobs=True, return_token_ids=True, **body)
        choice = data["choices"][0]
        return data["prompt_token_ids"], choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def command(model_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "trialforge.cli", "serve", "lm", str(model_dir), "--port", "0", "--threads", "1",
            "--max-new-tokens", str(MAX_NEW), *args]  # fmt: skip


@contextlib.contextmanager
def started(model_dir: Path, log: Path) -> Iterator[Server]:
    """A server process over ``model_dir`` while the block runs; then SIGTERM must stop it cleanly (status 0)."""
    with log.open("w") as stderr:
        process = subprocess.Popen(command(model_dir), stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 180)
        line = process.stdout.readline() if ready else ""  # type: ignore[union-attr]
        assert line.startswith("serving "), f"no ready line ({line!r}); log:\n{log.read_text()}"
        name, _, url = line.strip().removeprefix("serving ").rpartition(" at ")
        with httpx.Client(base_url=url, timeout=120) as http:
            yield Server(name, url, http)
    finally:
        process.terminate()
        status = process.wait(timeout=60)
    assert status == 0, log.read_text()  # reached only when the block passed: a failure inside it stays the one told


@pytest.fixture(scope="module")
def base(tiny_lm, tmp_path_factory) -> Iterator[Server]:
    with started(tiny_lm[0], tmp_path_factory.mktemp("lm-log") / "stderr") as server:
        yield server


@pytest.fixture(scope="module")
def native_dir(tiny_lm, tmp_path_factory) -> Path:
    """The tiny model with a chat template that renders tools."""
    path, _, tokenizer = tiny_lm
    out = tmp_path_factory.mktemp("native-lm") / "model"
    shutil.copytree(path, out)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


def policy(tiny_lm, chat_template: str | None = None) -> HFPolicy:
    _, model, tokenizer = tiny_lm
    if chat_template is not None:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = chat_template
    return HFPolicy(model, tokenizer, max_new_tokens=MAX_NEW)


def forward_logprobs(model: Any, prompt: list[int], ids: list[int], temperature: float) -> torch.Tensor:
    """log p(ids[i] | prompt, ids[:i]) under the sampling distribution at ``temperature``, by one forward pass."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1)


def close(a: list[float] | torch.Tensor, b: list[float] | torch.Tensor) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=1e-4)


@pytest.mark.services
def test_the_server_lists_its_model_and_answers_health(base, tiny_lm) -> None:
    assert httpx.get(base.url.removesuffix("/v1") + "/health").status_code == 200  # at the root, as vLLM's
    assert base.name == str(tiny_lm[0])
    assert base.http.get("/models").json() == {
        "object": "list",
        "data": [{"id": base.name, "object": "model", "owned_by": "trialforge", "root": base.name, "parent": None,
                  "max_model_len": 2048}],  # the context a client keeps within, as vLLM lists it
    }  # fmt: skip


@pytest.mark.services
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_a_reply_carries_the_prompt_it_was_conditioned_on_and_the_logprobs_it_was_sampled_with(
    base, tiny_lm, temperature
) -> None:
    data = base.reply(temperature=temperature, seed=3, logprobs=True, return_token_ids=True)
    choice = data["choices"][0]
    prompt, ids = data["prompt_token_ids"], choice["token_ids"]
    assert prompt == policy(tiny_lm).encode(MESSAGES)
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(logprobs) == len(ids) > 0 and close(logprobs, forward_logprobs(tiny_lm[1], prompt, ids, temperature))
    eos = tiny_lm[2].eos_token_id
    assert choice["finish_reason"] == ("stop" if ids[-1] == eos else "length")
    assert len(ids) == MAX_NEW or ids[-1] == eos
    text = tiny_lm[2].decode([i for i in ids if i != eos])
    assert choice["message"] == {"role": "assistant", "content": text, "tool_calls": []}
    assert data["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                             "total_tokens": len(prompt) + len(ids)}  # fmt: skip
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-") and data["model"] == base.name
    if temperature == 0:  # greedy: each token is the model's most likely one
        with torch.inference_mode():
            logits = tiny_lm[1](input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == ids


@pytest.mark.services
def test_token_ids_and_logprobs_come_only_when_asked(base) -> None:
    data = base.reply(seed=1, max_tokens=2)
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"] is None


@pytest.mark.services
def test_a_seed_replays_a_reply_and_other_seeds_draw_others(base) -> None:
    first = base.sample(seed=11)
    assert base.sample(seed=11) == first
    assert len({tuple(base.sample(seed=s)[1]) for s in range(12, 16)} | {tuple(first[1])}) > 1
    assert base.sample()[1] != base.sample()[1]  # no seed: fresh randomness (257 tokens per draw: never alike)


@pytest.mark.services
def test_max_tokens_bounds_the_reply_and_the_server_caps_it(base) -> None:
    for field, limit in (("max_tokens", 3), ("max_completion_tokens", 2)):
        choice = base.reply(seed=5, temperature=0, return_token_ids=True, **{field: limit})["choices"][0]
        assert len(choice["token_ids"]) == limit and choice["finish_reason"] == "length"
    greedy = base.reply(temperature=0, return_token_ids=True, max_tokens=1000)["choices"][0]
    assert len(greedy["token_ids"]) == MAX_NEW


@pytest.mark.services
def test_concurrent_requests_with_different_settings_do_not_disturb_each_other(base) -> None:
    asks = [{"seed": s, "temperature": t, "max_tokens": m} for s, t, m in
            [(1, 1.0, 16), (2, 0.5, 4), (3, 0.0, 9), (4, 2.0, 16), (5, 0.8, 1), (6, 1.0, 7)]]  # fmt: skip
    alone = [base.sample(**ask) for ask in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(lambda ask: base.sample(**ask), asks))
    for one, other in zip(alone, together, strict=True):
        assert one[:2] == other[:2] and close(one[2], other[2])


@pytest.mark.services
def test_a_template_without_tools_gets_them_in_the_system_message(base, tiny_lm) -> None:
    data = base.reply(messages=HISTORY, tools=TOOLS, max_tokens=1, return_token_ids=True)
    told = [
        {"role": "system", "content": f"{SYSTEM}\n\n{tools_note(TOOLS)}"},
        HISTORY[1],
        {"role": "assistant", "content": 'Let me look.\n{"name": "view", "arguments": {"path": "a.py"}}'},
        HISTORY[3],
    ]
    assert data["prompt_token_ids"] == policy(tiny_lm).encode(told, tools=None)
    prompt = tiny_lm[2].decode(data["prompt_token_ids"])
    assert '{"name": NAME, "arguments": {...}}' in prompt
    assert "- view(path: string, start: integer (optional), end: integer (optional)): Show a file" in prompt
    quiet = base.reply(messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=1, return_token_ids=True)
    assert quiet["prompt_token_ids"] == policy(tiny_lm).encode(MESSAGES)  # tool_choice none: no tools shown


@pytest.mark.services
def test_a_template_that_renders_tools_gets_them_through_the_template(native_dir, tiny_lm, tmp_path) -> None:
    tools = TOOLS[:2]
    with started(native_dir, tmp_path / "stderr") as server:
        data = server.reply(messages=HISTORY, tools=tools, max_tokens=2, return_token_ids=True, logprobs=True)
    prompt = data["prompt_token_ids"]
    assert prompt == policy(tiny_lm, TOOL_TEMPLATE).encode(HISTORY, tools=tools)
    text = tiny_lm[2].decode(prompt)
    assert json.dumps(tools[1]) in text and "- run:" not in text  # the schemas as the template renders them
    assert '[assistant]Let me look.<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call>' in text
    ids = data["choices"][0]["token_ids"]
    assert close([e["logprob"] for e in data["choices"][0]["logprobs"]["content"]],
                 forward_logprobs(tiny_lm[1], prompt, ids, 1.0))  # fmt: skip


@pytest.mark.services
def test_requests_the_server_cannot_serve_as_asked_are_refused_with_the_reason(base, tiny_lm) -> None:
    full = [{"role": "user", "content": "x" * 2020}]  # leaves room for a reply shorter than MAX_NEW
    unknown = base.http.post("/chat/completions", json={"model": "gpt-9", "messages": MESSAGES})
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"message": "The model `gpt-9` does not exist.", "type": "NotFoundError",
                                        "code": 404}}  # fmt: skip
    refused = {
        "stream": ({"stream": True}, "stream is not supported"),
        "n": ({"n": 2}, "n must be 1"),
        "tool_choice": ({"tool_choice": "required"}, "tool_choice must be 'auto' or 'none'"),
        "top_p": ({"top_p": 0.5}, "top_p=0.5 is not supported"),
        "stop": ({"stop": ["\n"]}, 'stop=["\\n"] is not supported'),
        "no room": ({"messages": [{"role": "user", "content": "x" * 2100}]}, "maximum context length is 2048"),
        "reply beyond": ({"messages": full, "max_tokens": MAX_NEW},
                         f"({len(policy(tiny_lm).encode(full))} in the messages, {MAX_NEW} in the completion)"),
        "bad arguments": ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [
            {**CALL, "function": {"name": "view", "arguments": "{nope"}}]}], "tools": TOOLS}, "are not JSON"),
    }  # fmt: skip
    for case, (body, says) in refused.items():
        answer = base.chat(**body)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], (case, answer.text)
        assert answer.json()["error"]["type"] == "BadRequestError"
    assert base.chat(top_p=1.0, stop=[], presence_penalty=0, user="me").status_code == 200  # neutral values pass
    room = 2048 - len(policy(tiny_lm).encode(full))
    assert len(base.reply(messages=full, return_token_ids=True, seed=1)["choices"][0]["token_ids"]) <= room < MAX_NEW
    assert base.chat(messages=[]).status_code == 422
    assert base.chat(temperature="hot").status_code == 422


@pytest.mark.services
def test_a_body_over_8_mib_is_refused_before_it_is_read(base) -> None:
    url = httpx.URL(base.url)
    with socket.create_connection((url.host, url.port)) as conn:  # declare a body and send none of it
        conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {9 * 1024 * 1024}\r\n\r\n".encode())  # fmt: skip
        answer = http.client.HTTPResponse(conn)
        answer.begin()
        assert answer.status == 413
        assert json.loads(answer.read())["error"]["message"] == "request body over 8388608 bytes"


@pytest.fixture(scope="module")
def adapters(tiny_lm, tmp_path_factory) -> dict[str, Path]:
    """LoRA adapters saved by peft: ``good`` for the tiny model (nonzero B, so it changes outputs), ``alien``
    for a GPT-2 of another width."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("adapters")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, lora_dropout=0.0)
    torch.manual_seed(7)
    bases = {
        "good": AutoModelForCausalLM.from_pretrained(tiny_lm[0]),
        "alien": GPT2LMHeadModel(
            GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=257, bos_token_id=0, eos_token_id=0)
        ),
    }
    for name, model in bases.items():
        lora = get_peft_model(model, copy.deepcopy(config))
        with torch.no_grad():
            for param_name, param in lora.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(std=0.5)
        lora.save_pretrained(root / name)
    return {name: root / name for name in bases}


@pytest.mark.services
def test_a_lora_adapter_loads_serves_as_peft_computes_it_and_unloads(base, tiny_lm, adapters) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    load = base.http.post("/load_lora_adapter", json={"lora_name": "fix", "lora_path": str(adapters["good"])})
    assert load.status_code == 200 and load.text == "Success: LoRA adapter 'fix' added successfully."
    listed = base.http.get("/models").json()["data"]
    assert listed[1] == {"id": "fix", "object": "model", "owned_by": "trialforge", "root": str(adapters["good"]),
                         "parent": base.name, "max_model_len": 2048}  # fmt: skip

    data = base.reply(model="fix", seed=2, logprobs=True, return_token_ids=True)
    assert data["model"] == "fix"
    prompt, ids = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    logprobs = [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm[0]), adapters["good"]).eval()
    assert close(logprobs, forward_logprobs(peft_model, prompt, ids, 1.0))
    assert not close(logprobs, forward_logprobs(tiny_lm[1], prompt, ids, 1.0))  # the adapter changed the model
    assert close(base.sample(seed=2)[2], forward_logprobs(tiny_lm[1], *base.sample(seed=2)[:2], 1.0))  # base as was

    refused = {
        "already loaded": ({"lora_name": "fix", "lora_path": str(adapters["good"])}, "has already been loaded"),
        "base name": ({"lora_name": base.name, "lora_path": str(adapters["good"])}, "is the base model's name"),
        "no adapter": ({"lora_name": "x", "lora_path": str(tiny_lm[0])}, "is not a peft adapter directory"),
        "other base": ({"lora_name": "x", "lora_path": str(adapters["alien"])}, "cannot load the adapter in"),
    }
    for case, (body, says) in refused.items():
        answer = base.http.post("/load_lora_adapter", json=body)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], (case, answer.text)

    unload = base.http.post("/unload_lora_adapter", json={"lora_name": "fix"})
    assert unload.status_code == 200 and unload.text == "Success: LoRA adapter 'fix' removed successfully."
    assert base.chat(model="fix").status_code == 404
    assert base.http.post("/unload_lora_adapter", json={"lora_name": "fix"}).status_code == 404
    assert [m["id"] for m in base.http.get("/models").json()["data"]] == [base.name]


def trained_to_reply(model: Any, prompt: list[int], reply: list[int]) -> Any:
    """A copy of ``model`` teacher-forced on ``reply`` after ``prompt``: greedy decoding then writes it."""
    trained = copy.deepcopy(model).train()
    ids = torch.tensor([prompt + reply])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimiser = torch.optim.Adam(trained.parameters(), lr=3e-3)
    for _ in range(150):
        optimiser.zero_grad()
        trained(input_ids=ids, labels=labels).loss.backward()
        optimiser.step()
    return trained.eval()


@pytest.mark.services
def test_weights_pushed_from_disk_serve_the_next_request_and_bad_ones_change_nothing(base, tiny_lm, tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    path, model, tokenizer = tiny_lm
    ask = {"tools": [t for t in TOOLS if t["function"]["name"] == "submit"], "temperature": 0}  # a short prompt
    before = base.sample(**ask)
    call = [*tokenizer.encode('{"name": "submit", "arguments": {}}'), tokenizer.eos_token_id]
    trained = trained_to_reply(model, before[0], call)  # the server's prompt, the tools note included
    trained.save_pretrained(tmp_path / "step-1")
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=300, bos_token_id=0, eos_token_id=0)
    ).save_pretrained(tmp_path / "other")

    for bad, says in ((tmp_path / "missing", "holds no model"), (tmp_path / "other", "with 300 tokens")):
        answer = base.update_weights(bad)
        assert answer.status_code == 400 and answer.json()["success"] is False and says in answer.json()["message"]
        assert base.sample(**ask) == before  # the old weights still serve
    try:
        pushed = base.update_weights(tmp_path / "step-1")
        assert pushed.status_code == 200 and pushed.json()["success"] is True, pushed.text
        choice = base.reply(**ask, return_token_ids=True)["choices"][0]
        assert choice["token_ids"] == call and choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None
        assert [c["function"] for c in choice["message"]["tool_calls"]] == [{"name": "submit", "arguments": "{}"}]
        prompt, ids, logprobs = base.sample(seed=4, max_tokens=8)
        assert close(logprobs, forward_logprobs(trained, prompt, ids, 1.0))
        assert not close(logprobs, forward_logprobs(model, prompt, ids, 1.0))
        assert base.http.get("/models").json()["data"][0]["root"] == str(tmp_path / "step-1")
        info = httpx.get(base.url.removesuffix("/v1") + "/get_model_info").json()  # SGLang's route
        assert info["model_path"] == str((tmp_path / "step-1").resolve())
    finally:
        restored = base.update_weights(path)
    assert restored.status_code == 200 and base.sample(**ask) == before


@pytest.mark.services
def test_a_model_directory_that_holds_no_model_fails_before_serving(tmp_path) -> None:
    done = subprocess.run(command(tmp_path), capture_output=True, text=True, timeout=180)
    assert done.returncode == 1 and done.stdout == ""
    assert f"error: {tmp_path} holds no model (no config.json)" in done.stderr


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "content", "call"),
    [
        ('{"name": "submit", "arguments": {}}', None, ("submit", {})),
        ('Done.\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>', "Done.", ("submit", {})),
        ('Look: {"name": "view", "arguments": {"path": "a.py"}}', "Look:", ("view", {"path": "a.py"})),
        ('{"tool": "run", "args": {"command": "ls"}}', None, ("run", {"command": "ls"})),
    ],
)
def test_a_reply_holding_a_tool_call_becomes_openai_tool_calls(text, content, call) -> None:
    message = assistant_message(text, parse_tools=True)
    assert message["role"] == "assistant" and message["content"] == content
    [tool_call] = message["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["id"].startswith("call_")
    assert (tool_call["function"]["name"], json.loads(tool_call["function"]["arguments"])) == call


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "parse_tools"),
    [('{"name": "submit", "arguments": {}}', False), ("no call here", True), ('{"name": 3}', True)],
)
def test_a_reply_without_tools_or_without_a_call_is_content(text, parse_tools) -> None:
    assert assistant_message(text, parse_tools) == {"role": "assistant", "content": text, "tool_calls": []}
