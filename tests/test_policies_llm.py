"""LLM policies: an OpenAI-compatible endpoint (a real HTTP server on 127.0.0.1 playing a script) driving
real episodes in bubblewrap sandboxes, and a local causal LM (a tiny randomly initialised transformers model
with a byte-level tokenizer built here: nothing is downloaded).
"""

from __future__ import annotations

import copy
import json
import logging
import math

import pytest
import torch
from support.chat_server import ChatServer, Fault, text_reply, tool_call

from trialforge.config import load_params
from trialforge.errors import ConfigError, InferenceError, PolicyError
from trialforge.pipeline import make_policies
from trialforge.rollout.chat import INVALID_TOOL, Conversation, chars, fit, parse_tool_call, text_call
from trialforge.rollout.context import ContextExhausted, ContextParams
from trialforge.rollout.env import TOOLS, Action, EnvLimits
from trialforge.rollout.loop import Lineage, Rollout
from trialforge.rollout.openai_policy import OpenAIPolicy
from trialforge.rollout.policies import TaskView
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.verify.grader import Grader

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
VIEW = TaskView("t", "add() subtracts")


@pytest.fixture(scope="module")
def world(bwrap_backend, base_image, tmp_path_factory):
    """One small task (add() subtracts) and a Rollout over real bubblewrap sandboxes."""
    root = tmp_path_factory.mktemp("llm")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    trees = {}
    for kind, files in (("base", {"calc/ops.py": BUGGY}), ("fixed", {"calc/ops.py": FIXED}),
                        ("tested", {"calc/ops.py": BUGGY, "tests/test_ops.py": TESTS})):  # fmt: skip
        trees[kind] = root / kind
        for rel, text in {"calc/__init__.py": "", **files}.items():
            (trees[kind] / rel).parent.mkdir(parents=True, exist_ok=True)
            (trees[kind] / rel).write_text(text)
    task = Task(
        task_id="calc-add",
        source=Source(kind="synthetic", ref="test"),
        repo="calc",
        snapshot=snapshots.put(trees["base"]),
        problem_statement="add(2, 3) returns -1 instead of 5.",
        gold_patch=diff_trees(trees["base"], trees["fixed"]),
        test_patch=diff_trees(trees["base"], trees["tested"]),
        fail_to_pass=["tests/test_ops.py::test_add"],
    )
    rollout = Rollout(
        backend=bwrap_backend,
        image=base_image.name,
        image_digest=base_image.digest,
        snapshots=snapshots,
        grader=Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60),
        limits=Limits(),
        env_limits=EnvLimits(max_turns=6),
        lineage=Lineage("llm-test", 0, "taskset", "params", "code"),
    )
    return task, rollout


def policy(server: ChatServer, **kwargs) -> OpenAIPolicy:
    options = {"timeout_s": 5.0, "max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, **kwargs}
    return OpenAIPolicy(server.url, "scripted-model", api_key="sk-test", **options)


# --- OpenAI-compatible endpoint ------------------------------------------------------------


@pytest.mark.sandbox
def test_a_scripted_model_fixes_a_task_through_view_replace_submit(world, chat_server):
    task, rollout = world
    chat_server.play(
        tool_call("view", {"path": "calc/ops.py"}, logprobs=[-0.5, -0.25], usage=(120, 9)),
        tool_call("replace", {"path": "calc/ops.py", "old": "a - b", "new": "a + b"}, logprobs=[-1.0]),
        tool_call("submit", logprobs=[-0.125]),
    )
    record = rollout.episode(task, policy(chat_server), sample=0, seed=7)

    assert (record.status, record.reward, record.termination) == ("ok", 1.0, "submitted")
    assert record.policy_version == "scripted-model"
    steps = record.step_rows
    assert [s.tool for s in steps] == ["view", "replace", "submit"]
    assert [s.logprob for s in steps] == [-0.75, -1.0, -0.125]
    assert (steps[0].tokens_in, steps[0].tokens_out, record.tokens_in) == (120, 9, 320)
    assert "return a - b" in steps[0].observation and not any(s.action_error for s in steps)
    assert "+    return a + b" in record.final_diff

    first, second, third = chat_server.requests
    assert all(r["tools"] == TOOLS and r["model"] == "scripted-model" for r in chat_server.requests)
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert task.problem_statement in first["messages"][1]["content"]
    call = second["messages"][-2]["tool_calls"][0]
    answer = second["messages"][-1]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("view", {"path": "calc/ops.py"})
    assert answer["role"] == "tool" and answer["tool_call_id"] == call["id"] and "a - b" in answer["content"]
    assert third["messages"][-1] == {
        "role": "tool",
        "tool_call_id": third["messages"][-2]["tool_calls"][0]["id"],
        "content": "replaced 1 occurrence in calc/ops.py",
    }
    assert first["seed"] != second["seed"]


@pytest.mark.pure
def test_server_errors_are_retried_until_an_answer_comes(chat_server):
    chat_server.play(Fault(500), Fault(429, headers={"Retry-After": "0"}), tool_call("submit"))
    decision = policy(chat_server).begin(VIEW, seed=1).act("fix it")
    assert decision.action == Action(tool="submit")
    assert decision.info["attempts"] == 3 and len(chat_server.requests) == 3
    assert decision.logprob is None  # the answer carried no logprobs
    assert chat_server.requests[0] == chat_server.requests[2]  # a retry resends the same request


@pytest.mark.pure
def test_a_retry_waits_the_servers_retry_after_up_to_the_longest_backoff(chat_server):
    chat_server.play(
        Fault(503, headers={"Retry-After": "0.04"}), Fault(429, headers={"Retry-After": "3600"}), tool_call("submit")
    )
    decision = policy(chat_server, backoff_s=0.001, max_backoff_s=0.05).begin(VIEW, seed=1).act("fix it")
    assert decision.info["attempts"] == 3
    assert decision.info["retry_wait_s"] == 0.09  # the waits tenacity chose (0.04, then 3600 capped to 0.05)


@pytest.mark.sandbox
def test_a_hanging_endpoint_is_an_env_error_tried_again_never_the_policys_failure(world, chat_server, caplog):
    task, rollout = world
    # Hangs far past any run (the fixture's teardown ends them); a client that waited one out would
    # have got its HTTP 500 and logged that instead of a timeout: the clock-free proof that it gave up.
    chat_server.play(*[Fault(hang_s=3600)] * 4)
    with caplog.at_level(logging.WARNING, logger="trialforge.rollout.openai_policy"):
        record = rollout.episode(task, policy(chat_server, timeout_s=0.5, max_retries=1), sample=0, seed=1)
    assert (record.status, record.reward, record.termination) == ("env_error", None, "error")
    assert record.cause.startswith("inference: ") and "failed 2 times; last: timed out" in record.cause
    assert record.attempt == 2  # the episode was tried again (rollout.env_retries), as for a dead sandbox
    failures = [r.getMessage() for r in caplog.records if "chat completion attempt" in r.getMessage()]
    assert len(failures) == 4 and all("failed: timed out" in f for f in failures)
    assert len(chat_server.requests) == 4


@pytest.mark.pure
def test_a_client_error_is_not_retried(chat_server):
    chat_server.play(Fault(400), tool_call("submit"))
    with pytest.raises(PolicyError, match=r"HTTP 400.*not retried"):
        policy(chat_server).begin(VIEW, seed=1).act("fix it")
    assert len(chat_server.requests) == 1


def with_token_ids(reply: dict, prompt: list[int], ids: list[int]) -> dict:
    """A reply as vLLM writes it when asked for ``return_token_ids``."""
    reply["prompt_token_ids"] = prompt
    reply["choices"][0]["token_ids"] = ids
    return reply


@pytest.mark.pure
def test_a_server_sampled_learner_records_what_the_trainer_scores(chat_server):
    chat_server.play(with_token_ids(tool_call("submit", logprobs=[-0.5, -1.5]), [5, 6, 7], [8, 9]))
    decision = policy(chat_server, token_ids=True, temperature=0.7, version="v3").begin(VIEW, seed=1).act("fix it")
    asked = chat_server.requests[0]
    assert asked["return_token_ids"] is True and asked["logprobs"] is True
    info = decision.info
    assert (info["prompt_ids"], info["token_ids"], info["token_logprobs"]) == ([5, 6, 7], [8, 9], [-0.5, -1.5])
    assert info["temperature"] == 0.7 and info["entropy"] == 1.0  # -mean log p of the sampled tokens
    assert decision.logprob == -2.0


@pytest.mark.pure
def test_a_server_that_cannot_give_token_ids_stops_training_with_a_clear_error(chat_server):
    chat_server.play(tool_call("submit", logprobs=[-0.5]))
    with pytest.raises(ConfigError, match=r"returned no prompt_token_ids/token_ids: .*return_token_ids"):
        policy(chat_server, token_ids=True).begin(VIEW, seed=1).act("fix it")
    chat_server.play(with_token_ids(tool_call("submit", logprobs=[-0.5]), [1], [2, 3]))
    with pytest.raises(InferenceError, match="2 token ids but 1 log-probabilities"):
        policy(chat_server, token_ids=True).begin(VIEW, seed=1).act("fix it")
    with pytest.raises(ConfigError, match="needs the log-probabilities"):
        policy(chat_server, token_ids=True, logprobs=False)


@pytest.mark.pure
def test_a_model_the_server_lost_is_loaded_again_and_asked_again(chat_server):
    loads: list[int] = []
    chat_server.play(Fault(404), tool_call("submit"))
    decision = policy(chat_server, on_missing_model=lambda: loads.append(1)).begin(VIEW, seed=1).act("fix it")
    assert decision.action == Action(tool="submit") and loads == [1] and decision.info["attempts"] == 2
    chat_server.play(Fault(404))
    with pytest.raises(PolicyError, match=r"HTTP 404.*not retried"):  # no way to load it: the model is unknown
        policy(chat_server).begin(VIEW, seed=1).act("fix it")


@pytest.mark.sandbox
def test_malformed_replies_are_invalid_actions_the_episode_survives(world, chat_server):
    task, rollout = world
    chat_server.play(
        tool_call("view", arguments='{"path": "calc/ops.py"'),
        text_reply("I believe the bug is in ops.py."),
        tool_call("submit"),
    )
    record = rollout.episode(task, policy(chat_server), sample=0, seed=2)

    assert (record.status, record.reward) == ("ok", 0.0)  # graded: the policy's mistakes are its own
    steps = record.step_rows
    assert [s.tool for s in steps] == [INVALID_TOOL, INVALID_TOOL, "submit"]
    assert [s.action_error for s in steps] == [True, True, False]
    assert "not valid JSON" in json.loads(steps[0].args)["error"]
    second, third = chat_server.requests[1:]
    told = second["messages"][-1]
    assert told["role"] == "user" and "arguments of 'view' are not valid JSON" in told["content"]
    assert "tool_calls" not in second["messages"][-2]  # no call left waiting for a tool answer
    assert third["messages"][-2]["content"] == "I believe the bug is in ops.py."
    assert "the reply has no tool call" in third["messages"][-1]["content"]


def tokens_as_chars(request: dict) -> dict:
    """A reply whose usage counts a token per character of the messages, as a byte-level tokenizer would."""
    return tool_call("run", {"command": "ls"}, usage=(chars(request["messages"]) + 300, 20))


@pytest.mark.pure
def test_a_long_conversation_drops_its_oldest_turns_whole(chat_server):
    chat_server.answer_with(tokens_as_chars)
    episode = policy(chat_server, context=ContextParams(tokens=2500), max_tokens=100).begin(VIEW, seed=1)
    for i in range(4):
        decision = episode.act(f"observation {i} " + "x" * 500)
    messages = chat_server.requests[-1]["messages"]
    assert decision.info["dropped_turns"] == 1
    assert "1 earlier turn(s)" in messages[1]["content"] and "observation 0" in messages[1]["content"]
    assert "observation 1" not in json.dumps(messages) and "observation 3" in messages[-1]["content"]
    called = {c["id"] for m in messages for c in m.get("tool_calls", [])}
    assert all(m["tool_call_id"] in called for m in messages if m["role"] == "tool")
    asked = [r["max_tokens"] for r in chat_server.requests]
    assert all(a <= 100 for a in asked)
    # Each request fit by the server's own count: its prompt and its capped reply within the window.
    assert all(chars(r["messages"]) + 300 + r["max_tokens"] <= 2500 for r in chat_server.requests)


@pytest.mark.pure
def test_a_conversation_that_cannot_fit_ends_in_context_exhausted_not_an_error(chat_server):
    """Kept whole (``keep_all``), the conversation outgrows the window: the reply's max_tokens shrinks to what is
    left, then the policy stops before a request that cannot fit. A server refusing for the context says so too."""
    chat_server.answer_with(tokens_as_chars)
    keep_all = ContextParams(tokens=2000, strategy="keep_all", min_reply_tokens=8)
    episode = policy(chat_server, context=keep_all, max_tokens=100).begin(VIEW, seed=1)
    with pytest.raises(ContextExhausted, match="of the context's 2000 tokens"):
        for i in range(10):
            episode.act(f"observation {i} " + "x" * 150)
    asked = [r["max_tokens"] for r in chat_server.requests]
    assert asked[0] == 100 and asked[-1] < 100  # the last replies got what was left
    assert all(chars(r["messages"]) + 300 + r["max_tokens"] <= 2000 for r in chat_server.requests[1:])

    chat_server.answer_with(None)
    refusal = "This model's maximum context length is 2048 tokens. However, you requested 2386 tokens"
    chat_server.play(Fault(400, message=refusal))
    with pytest.raises(ContextExhausted, match="maximum context length"):
        policy(chat_server).begin(VIEW, seed=1).act("fix it")


@pytest.mark.pure
def test_the_last_turns_strategy_keeps_the_task_and_the_latest_turns(chat_server):
    chat_server.answer_with(tokens_as_chars)
    last_two = ContextParams(strategy="last_turns", keep_turns=2)
    episode = policy(chat_server, context=last_two).begin(VIEW, seed=1)
    dropped = [episode.act(f"observation {i}").info["dropped_turns"] for i in range(5)]
    assert dropped == [0, 0, 0, 1, 2]
    messages = chat_server.requests[-1]["messages"]
    assert "2 earlier turn(s)" in messages[1]["content"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["observation 3", "observation 4"]


# --- parsing and fitting -------------------------------------------------------------------


@pytest.mark.pure
def test_tool_call_arguments_must_be_a_json_object():
    assert parse_tool_call("view", '{"path": "a.py"}') == Action(tool="view", args={"path": "a.py"})
    assert parse_tool_call("submit", "") == Action(tool="submit")
    assert parse_tool_call("frobnicate", "{}").tool == "frobnicate"  # the environment judges tool names
    assert "must be a JSON object, not list" in parse_tool_call("view", "[1]").args["error"]


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "prose", "expected"),
    [
        (
            'Let me look. {"tool": "view", "args": {"path": "a.py"}} ok',
            "Let me look.",
            Action(tool="view", args={"path": "a.py"}),
        ),
        ('{"note": 1} then {"tool": "submit"}', '{"note": 1} then', Action(tool="submit")),
        ('{"tool": "run", "args": {"command": "echo }"}}', "", Action(tool="run", args={"command": "echo }"})),
        (
            'Reading. <tool_call>{"name": "view", "arguments": {"path": "b.py"}}</tool_call>',
            "Reading.",
            Action(tool="view", args={"path": "b.py"}),
        ),
    ],
)
def test_a_text_reply_yields_its_first_tool_object_and_the_prose_before_it(text, prose, expected):
    assert text_call(text) == (prose, expected)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("text", "error"),
    [("no json here", "holds no JSON object"), ('{"tool": 3, "args": {}}', 'string "tool"'), ("{tool: x}", "holds no")],
)
def test_a_text_reply_without_a_tool_object_is_invalid(text, error):
    prose, action = text_call(text)
    assert prose == text and action.tool == INVALID_TOOL and error in action.args["error"]


@pytest.mark.pure
def test_fit_keeps_the_task_and_the_latest_turn_when_nothing_smaller_fits():
    conversation = Conversation("sys", native_tools=False)
    for i in range(3):
        conversation.observe(f"obs {i}")
        conversation.reply(f"reply {i}", Action(tool="submit"))
    fitted = fit(conversation.messages, lambda m: False)
    assert fitted.dropped_turns == 2
    assert [m["content"].split("\n")[0] for m in fitted.messages] == ["sys", "obs 0", "reply 2"]


# --- local causal LM (transformers) --------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def hf_policy(tiny_lm, **kwargs):
    from trialforge.rollout.hf_policy import HFPolicy

    _, model, tokenizer = tiny_lm
    return HFPolicy(model, tokenizer, **{"max_new_tokens": 24, "temperature": 0.8, **kwargs})


def recompute(model, prompt_ids: list[int], token_ids: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(token_ids).unsqueeze(1)).squeeze(1).tolist()


@pytest.mark.pure
def test_local_lm_logprobs_match_a_forward_pass(tiny_lm):
    from trialforge.rollout.hf_policy import HFPolicy

    path, model, _ = tiny_lm
    loaded = HFPolicy(str(path), max_new_tokens=24, temperature=0.8)  # from local files only
    decision = loaded.begin(VIEW, seed=3).act("fix add()")
    info = decision.info
    assert loaded.version == str(path)
    assert decision.tokens_out == len(info["token_ids"]) == len(info["token_logprobs"]) > 0
    assert decision.tokens_in == len(info["prompt_ids"])
    assert math.isfinite(decision.logprob) and decision.logprob < 0
    again = recompute(model, info["prompt_ids"], info["token_ids"], 0.8)
    assert again == pytest.approx(info["token_logprobs"], abs=1e-4)
    assert decision.logprob == pytest.approx(sum(again), abs=1e-3)
    # The mean entropy (nats) of the distributions the tokens were drawn from, as the forward pass has it.
    assert math.isfinite(info["entropy"]) and 0 <= info["entropy"] <= math.log(model.config.vocab_size)
    ids = torch.tensor([info["prompt_ids"] + info["token_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(info["prompt_ids"]) - 1 : -1].float()
    expected = torch.distributions.Categorical(logits=logits / 0.8).entropy().mean()
    assert info["entropy"] == pytest.approx(float(expected), abs=1e-4)


@pytest.mark.pure
def test_local_lm_replays_exactly_under_a_seed(tiny_lm):
    policy = hf_policy(tiny_lm)

    def tokens(seed: int) -> list[list[int]]:
        episode = policy.begin(VIEW, seed)
        return [episode.act(obs).info["token_ids"] for obs in ("fix add()", "error: bad reply")]

    assert tokens(11) == tokens(11)
    assert tokens(11) != tokens(12)


@pytest.mark.pure
def test_local_lm_babble_is_an_invalid_action_shown_back_to_it(tiny_lm):
    episode = hf_policy(tiny_lm).begin(VIEW, seed=5)
    first = episode.act("fix add()")
    assert first.action.tool == INVALID_TOOL and first.info["text"]
    second = episode.act("error: unknown tool 'invalid'")
    prompt = hf_policy(tiny_lm).tokenizer.decode(second.info["prompt_ids"])
    assert prompt.startswith("<|system|>\n") and prompt.endswith("<|assistant|>\n")
    assert first.info["text"] + "<|endoftext|>\n<|user|>\nYour reply was not a valid tool call" in prompt


@pytest.mark.pure
def test_local_lm_uses_the_tokenizers_chat_template_when_it_has_one(tiny_lm):
    policy = hf_policy(tiny_lm)
    policy.tokenizer = copy.deepcopy(policy.tokenizer)
    policy.tokenizer.chat_template = CHAT_TEMPLATE
    prompt = policy.tokenizer.decode(policy.begin(VIEW, seed=1).act("fix add()").info["prompt_ids"])
    assert prompt.startswith("[system]You are") and prompt.endswith("[user]fix add()[assistant]")


@pytest.mark.pure
def test_local_lm_drops_old_turns_to_fit_and_its_context_is_exhausted_when_the_task_cannot(tiny_lm):
    from trialforge.rollout.hf_policy import HFPolicy

    observations = ("fix add()", "a" * 300, "b" * 300)
    free = hf_policy(tiny_lm).begin(VIEW, seed=1)
    lengths = [free.act(obs).tokens_in for obs in observations]
    budget = lengths[1] + 120  # room for the task, one turn and the note saying what was left out
    assert lengths[2] > budget
    episode = hf_policy(tiny_lm, context_tokens=budget + 24).begin(VIEW, seed=1)
    decisions = [episode.act(obs) for obs in observations]
    assert [d.info["dropped_turns"] for d in decisions] == [0, 0, 1]
    assert [d.tokens_in for d in decisions[:2]] == lengths[:2] and decisions[2].tokens_in <= budget
    prompt = episode.policy.tokenizer.decode(decisions[2].info["prompt_ids"])
    assert "1 earlier turn(s)" in prompt and "a" * 300 not in prompt and "b" * 300 in prompt

    _, model, tokenizer = tiny_lm
    tight = HFPolicy(model, tokenizer, max_new_tokens=24, context_tokens=lengths[0])
    with pytest.raises(ContextExhausted, match="leaving 0 for a reply"):
        tight.begin(VIEW, seed=1).act("fix add()")


@pytest.mark.pure
def test_a_local_lm_trained_to_submit_submits(tiny_lm):
    """Teacher-force the tiny model on one reply; greedy decoding must then produce that tool call."""
    _, model, tokenizer = tiny_lm
    trained = type(model)(model.config)
    trained.load_state_dict(model.state_dict())
    policy = hf_policy((None, trained, tokenizer), max_new_tokens=40, temperature=0.0, system="Reply with a tool call.")
    prompt_ids = policy.begin(VIEW, seed=1).act("fix add()").info["prompt_ids"]
    target = [*tokenizer.encode('{"tool": "submit", "args": {}}', add_special_tokens=False), tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + target])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    trained.train()
    optimiser = torch.optim.Adam(trained.parameters(), lr=3e-3)
    for _ in range(150):
        optimiser.zero_grad()
        trained(input_ids=ids, labels=labels).loss.backward()
        optimiser.step()
    trained.eval()

    decision = policy.begin(VIEW, seed=1).act("fix add()")
    assert decision.action == Action(tool="submit")
    assert decision.info["token_ids"] == target
    assert decision.logprob > -3.0  # untrained, each of these 31 tokens costs about -5.5


# --- language models named in params (rollout.models) ---------------------------------------


@pytest.mark.sandbox
def test_a_local_model_named_in_params_is_built_once_and_rolls_out(world, tiny_lm, tmp_path):
    task, rollout = world
    path = str(tiny_lm[0])
    overrides = {
        "rollout.policies": ["noop", "tiny"],
        "rollout.models": {"tiny": {"kind": "transformers", "model": path, "max_new_tokens": 8}},
        "rollout.temperature": 0.7,
        "rollout.context": {"strategy": "last_turns", "keep_turns": 2},
    }
    params = load_params(None, overrides)
    noop, tiny = make_policies(params.rollout.policies, [task], None, params.rollout)
    assert (noop.name, tiny.name, tiny.version) == ("noop", "tiny", path)
    assert tiny.context == ContextParams(strategy="last_turns", keep_turns=2)  # rollout.context reaches the model
    assert (tiny.max_new_tokens, tiny.temperature, tiny.device) == (8, 0.7, "cpu")  # rollout's temperature
    again = make_policies(["tiny"], [task], None, load_params(None, overrides).rollout)[0]
    assert again is tiny  # one model per process, whatever the shards ask
    record = rollout.episode(task, tiny, sample=0, seed=3)
    assert (record.status, record.policy, record.policy_version) == ("ok", "tiny", path)
    assert record.reward == 0.0 and record.termination == "max_turns"  # random weights babble: graded, not failed
    assert record.step_rows and all(s.tool == INVALID_TOOL and s.tokens_out <= 8 for s in record.step_rows)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("models", "policies", "error"),
    [
        ({"gold": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}}, ["gold"], "shadow"),
        ({"m": {"kind": "openai", "base_url": "127.0.0.1:8000", "model": "m"}}, ["m"], "http:// or https://"),
        ({"m": {"kind": "vllm", "model": "m"}}, ["m"], "does not match any of the expected tags"),
        ({"m": {"kind": "transformers", "model": "x", "temprature": 0.5}}, ["m"], "temprature"),
        ({"m/1": {"kind": "transformers", "model": "x"}}, ["m/1"], "must be a letter"),
        ({}, ["gold", "qwen"], r"policies \['qwen'\] are neither built in nor defined in rollout.models"),
    ],
)
def test_model_policies_in_params_are_checked_when_params_load(models, policies, error):
    with pytest.raises(ConfigError, match=error):
        load_params(None, {"rollout.models": models, "rollout.policies": policies})


@pytest.mark.pure
def test_a_local_model_that_is_not_there_is_a_clear_error_when_the_rollout_builds_it(tmp_path):
    params = load_params(None, {"rollout.models": {"m": {"kind": "transformers", "model": str(tmp_path / "no")}},
                                "rollout.policies": ["m"]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"rollout.models.m.model: .* is not a directory"):
        make_policies(["m"], [], None, params.rollout)


@pytest.mark.pure
def test_an_endpoint_named_in_params_takes_its_key_from_the_variable_it_names(chat_server, monkeypatch):
    monkeypatch.setenv("TF_TEST_MODEL_KEY", "sk-from-the-environment")
    spec = {"kind": "openai", "base_url": chat_server.url, "model": "m", "api_key_env": "TF_TEST_MODEL_KEY"}
    params = load_params(None, {"rollout.models": {"keyed": spec}, "rollout.policies": ["keyed"]})
    (keyed,) = make_policies(["keyed"], [], None, params.rollout)
    chat_server.play(tool_call("submit"))
    assert keyed.begin(VIEW, seed=1).act("fix add()").action.tool == "submit"
    assert chat_server.headers[0]["Authorization"] == "Bearer sk-from-the-environment"
    assert "sk-from-the-environment" not in params.model_dump_json()  # params name the variable, never the key


@pytest.mark.pure
def test_a_local_model_asked_for_a_gpu_gets_one_or_a_clear_error_where_there_is_none(tiny_lm):
    spec = {"kind": "transformers", "model": str(tiny_lm[0]), "device": "cuda"}
    params = load_params(None, {"rollout.models": {"m": spec}, "rollout.policies": ["m"]})
    if torch.cuda.is_available():
        assert make_policies(["m"], [], None, params.rollout)[0].device == "cuda"
        return
    with pytest.raises(ConfigError, match=r"rollout.models.m.device is 'cuda', but torch sees no GPU"):
        make_policies(["m"], [], None, params.rollout)


# A Qwen/Hermes-style template: tool schemas in the system turn, calls as <tool_call> JSON, answers as tool turns.
TOOL_TEMPLATE = (
    "[system]{{ messages[0].content }}"
    "{% if tools %}# Tools{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    'Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>{% endif %}'
    "{% for m in messages[1:] %}"
    "{% if m.role == 'assistant' %}[assistant]{{ m.content }}{% for c in m.tool_calls or [] %}"
    '<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}"
    "{% elif m.role == 'tool' %}[tool]<tool_response>{{ m.content }}</tool_response>"
    "{% else %}[{{ m.role }}]{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.mark.pure
def test_a_local_lm_whose_template_renders_tools_is_prompted_and_answered_in_its_own_format(tiny_lm):
    from trialforge.rollout.hf_policy import HFPolicy

    _, model, tokenizer = tiny_lm
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    policy = HFPolicy(model, tokenizer, max_new_tokens=8)
    assert policy.native_tools and "- view(" not in policy.system  # the schemas come through the template
    prompt = tokenizer.decode(policy.begin(VIEW, seed=1).act("fix add()").info["prompt_ids"])
    assert '"name": "view"' in prompt and prompt.endswith("[user]fix add()[assistant]")

    # What a model of that family writes, read and kept as its own tool call; the answer comes back as a tool turn.
    conversation = Conversation(policy.system, native_tools=policy.native_tools)
    conversation.observe("fix add()")
    reply = 'Let me look.\n<tool_call>\n{"name": "view", "arguments": {"path": "calc/ops.py"}}\n</tool_call>'
    assert conversation.reply_text(reply, call_id="call_1") == Action(tool="view", args={"path": "calc/ops.py"})
    call = conversation.messages[-1]
    assert call["content"] == "Let me look." and call["tool_calls"][0]["id"] == "call_1"
    conversation.observe("1  def add(a, b):")
    assert conversation.messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "1  def add(a, b):"}
    rendered = tokenizer.decode(policy.encode(conversation.messages))
    assert rendered.count("<tool_call>") == 2  # the instructions' example and the one call: not rendered twice
    assert '[assistant]Let me look.<tool_call>{"name": "view", "arguments": {"path": "calc/ops.py"}}' in rendered
    assert rendered.endswith("[tool]<tool_response>1  def add(a, b):</tool_response>[assistant]")

    # A malformed call is a mistake shown back to the model, not a crash.
    bad = conversation.reply_text('<tool_call>{"name": "view", "arguments": "calc/ops.py"}</tool_call>', "call_2")
    assert bad.tool == INVALID_TOOL and "tool_calls" not in conversation.messages[-1]
    conversation.observe("error: unknown tool 'invalid'")
    assert conversation.messages[-1]["role"] == "user"
    assert conversation.messages[-1]["content"].startswith("Your reply was not a valid tool call")


@pytest.mark.pure
def test_the_context_settings_reach_the_learner_in_process_and_served(tiny_lm, tmp_path):
    from trialforge.loop.learner import rollout_policy

    context = {"tokens": 512, "strategy": "keep_all", "min_reply_tokens": 4}
    base = {"train.model": str(tiny_lm[0]), "train.lr": 1e-6, "rollout.context": context}
    store = open_store(f"file://{tmp_path / 'store'}")
    local = rollout_policy(load_params(None, base), store, None)
    assert (local.context, local.context_tokens) == (ContextParams(**context), 512)
    door = {**base, "train.inference.url": "http://127.0.0.1:9/v1", "train.inference.api": "sglang"}
    served = rollout_policy(load_params(None, door), store, None)
    assert served.policy.context == ContextParams(**context) and served.policy.window() == 512  # asks no server
