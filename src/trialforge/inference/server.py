"""An OpenAI-compatible inference server over a local transformers causal LM (``trialforge serve lm``).

It speaks the subset of vLLM's HTTP API (and two routes of SGLang's) that an RL trainer uses, field for field, so
that "sample through a server, train, push new weights to the server" runs where vLLM cannot (a CPU, a small GPU)
with the client code that talks to vLLM in production. Sampling is ``HFPolicy``'s: reproducible under ``seed``, each
sampled token's log-probability that of the distribution it was drawn from (``log_softmax(logits / temperature)``).
A sampling option it does not honour is refused, never ignored. Adapters are merged into copies of the base, so
names share no mutable state; a request keeps the weights it began on.
Routes, fields and weights: docs/inference-server.md, "Routes" and "Weights".
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field

from trialforge.errors import ConfigError, TrialforgeError
from trialforge.httpserve import BodyCap, bind, in_thread
from trialforge.rollout.chat import INVALID_TOOL, text_call, tool_signature
from trialforge.rollout.hf_policy import HFPolicy

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
# Sampling options of vLLM's API this server does not implement, with the values that leave sampling as it is.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_p": (1,),
    "top_k": (-1, 0),
    "min_p": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "stop": ("", []),
    "stop_token_ids": ([],),
    "logit_bias": ({},),
    "top_logprobs": (0,),
    "response_format": ({"type": "text"},),
}


class RequestRefused(TrialforgeError):
    """A request the server will not serve, answered with ``status`` in OpenAI's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send more than a server honours (OpenAI's SDK does)


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


class ToolCall(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSpec(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatRequest(_Body):
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None  # None: "auto"
    temperature: float | None = Field(None, ge=0)  # None: 1.0; 0: greedy
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    logprobs: bool | None = None
    return_token_ids: bool | None = None
    stream: bool | None = None
    n: int | None = None


class LoadLora(_Body):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLora(_Body):
    lora_name: str


class UpdateWeights(_Body):
    model_path: str = Field(min_length=1)


@dataclass(frozen=True)
class Served:
    """A name the server answers to: its policy (weights and tokenizer) and the directory its weights came from."""

    name: str
    root: str
    parent: str | None
    policy: HFPolicy


class ModelHost:
    """The models served, by name: the base and the adapters merged onto copies of it, behind one lock."""

    def __init__(self, policy: HFPolicy, name: str, root: str) -> None:
        self.base = name
        self._lock = threading.Lock()
        self._served = {name: Served(name, root, None, policy)}

    def get(self, name: str) -> Served:
        with self._lock:
            served = self._served.get(name)
        if served is None:
            raise RequestRefused(404, f"The model `{name}` does not exist.")
        return served

    def listing(self) -> list[Served]:
        with self._lock:
            return list(self._served.values())

    def load_adapter(self, name: str, path: Path) -> None:
        """Merge the peft adapter in ``path`` onto a copy of the base and serve it as ``name``."""
        if name == self.base:
            raise RequestRefused(400, f"'{name}' is the base model's name; give the adapter another")
        with self._lock:
            self._refuse_loaded(name)
        base = self.get(self.base).policy
        policy = _sibling(base, merged_adapter(base, path), str(path))  # slow: outside the lock
        with self._lock:
            self._refuse_loaded(name)  # another request may have loaded it meanwhile
            self._served[name] = Served(name, str(path), self.base, policy)
        log.info("LoRA adapter %s loaded from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name == self.base or name not in self._served:
                raise RequestRefused(404, f"The lora adapter '{name}' cannot be found.")
            del self._served[name]
        log.info("LoRA adapter %s unloaded", name)

    def update_weights(self, path: Path) -> None:
        """Serve the model in ``path`` as the base from the next request on."""
        base = self.get(self.base).policy
        policy = _sibling(base, load_weights(base, path), str(path))
        with self._lock:
            self._served[self.base] = Served(self.base, str(path), None, policy)
        log.info("base weights of %s now from %s", self.base, path)

    def _refuse_loaded(self, name: str) -> None:
        if name in self._served:
            raise RequestRefused(400, f"The lora adapter '{name}' has already been loaded.")


def open_host(model_dir: Path, name: str, max_new_tokens: int, device: str, threads: int | None) -> ModelHost:
    """The base model and its tokenizer from ``model_dir``; a ConfigError saying why when they cannot serve."""
    if threads is not None:
        torch.set_num_threads(threads)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir} holds no model (no config.json): give a directory saved with save_pretrained")
    try:
        policy = HFPolicy(str(model_dir), max_new_tokens=max_new_tokens, device=resolve_device(device), name=name)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the model and tokenizer in {model_dir}: {exc}") from exc
    log.info("loaded %s on %s (context %d tokens)", model_dir, policy.device, policy.context_tokens)
    return ModelHost(policy, name, str(model_dir))


def resolve_device(device: str) -> str:
    """``auto`` is the GPU when torch sees one; a GPU asked for that is not there is a clear error, not a crash."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, not {device!r}")
    index = int(device.partition(":")[2] or 0)
    if device != "cpu" and index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def merged_adapter(base: HFPolicy, path: Path) -> Any:
    """A copy of the base model with the peft adapter in ``path`` merged into its weights."""
    from peft import PeftConfig, PeftModel

    if not (path / "adapter_config.json").is_file():
        raise RequestRefused(400, f"{path} is not a peft adapter directory (no adapter_config.json)")
    try:
        model = PeftModel(copy.deepcopy(base.model), PeftConfig.from_pretrained(str(path)))
        loaded = model.load_adapter(str(path), "default", torch_device=base.device)
    except Exception as exc:  # whatever the files hold: the request is refused, the server serves on
        raise RequestRefused(400, f"cannot load the adapter in {path} onto {base.version}: {exc}") from exc
    if loaded.missing_keys or loaded.unexpected_keys:
        raise RequestRefused(
            400,
            f"the adapter in {path} does not fit {base.version}: missing weights {loaded.missing_keys[:3]}, "
            f"unexpected weights {loaded.unexpected_keys[:3]}",
        )
    return model.merge_and_unload()


def load_weights(base: HFPolicy, path: Path) -> Any:
    """The model saved in ``path``, checked to have the base's architecture and vocabulary (the tokenizer stays)."""
    from transformers import AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise RequestRefused(400, f"{path} holds no model (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # whatever the files hold: the request is refused, the old weights serve on
        raise RequestRefused(400, f"cannot load the model in {path}: {exc}") from exc
    old, new = base.model.config, model.config
    if (new.architectures, new.vocab_size) != (old.architectures, old.vocab_size):
        raise RequestRefused(
            400,
            f"{path} holds {new.architectures} with {new.vocab_size} tokens; the server's tokenizer needs "
            f"{old.architectures} with {old.vocab_size}",
        )
    return model


def _sibling(base: HFPolicy, model: Any, version: str) -> HFPolicy:
    return HFPolicy(model, base.tokenizer, max_new_tokens=base.max_new_tokens, device=base.device, version=version)


def complete(served: Served, req: ChatRequest) -> dict[str, Any]:
    """Answer one chat completion request in vLLM's response shape."""
    refuse_unsupported(req)
    policy = served.policy
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []] if req.tool_choice != "none" else []
    prompt_ids = encode(policy, [m.model_dump(exclude_none=True) for m in req.messages], tools)
    limit = new_token_limit(req, policy, len(prompt_ids))
    temperature = 1.0 if req.temperature is None else req.temperature
    generator = torch.Generator(device=policy.device)
    if req.seed is None:
        generator.seed()
    else:
        generator.manual_seed(req.seed % 2**63)
    ids, logprobs, _ = policy.draw(prompt_ids, generator, max_new_tokens=limit, temperature=temperature)
    return completion(served, req, prompt_ids, ids, logprobs, parse_tools=bool(tools))


def completion(
    served: Served, req: ChatRequest, prompt_ids: list[int], ids: list[int], logprobs: list[float], parse_tools: bool
) -> dict[str, Any]:
    """The response to ``req``: the sampled ``ids`` as a message, with their log-probabilities and token ids
    when asked."""
    tokenizer, stop_ids = served.policy.tokenizer, served.policy.stop_ids
    message = assistant_message(tokenizer.decode([i for i in ids if i not in stop_ids], skip_special_tokens=True),
                                parse_tools)  # fmt: skip
    stopped = bool(ids) and ids[-1] in stop_ids
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": {"content": token_logprobs(tokenizer, ids, logprobs)} if req.logprobs else None,
        "finish_reason": "tool_calls" if message["tool_calls"] else "stop" if stopped else "length",
    }
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served.name,
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                  "total_tokens": len(prompt_ids) + len(ids)},
    }  # fmt: skip
    if req.return_token_ids:
        choice["token_ids"] = ids
        body["prompt_token_ids"] = prompt_ids
    return body


def refuse_unsupported(req: ChatRequest) -> None:
    """Refuse what this server would otherwise answer wrongly: several choices, a stream, a constrained tool
    choice, a sampling option it does not implement."""
    if req.stream:
        raise RequestRefused(400, "stream is not supported by this server: ask with stream false")
    if req.n not in (None, 1):
        raise RequestRefused(400, f"n must be 1 (one choice per request), not {req.n}")
    if req.tool_choice not in (None, "auto", "none"):
        raise RequestRefused(400, f"tool_choice must be 'auto' or 'none', not {json.dumps(req.tool_choice)}")
    for key, value in (req.model_extra or {}).items():
        if key in NEUTRAL and value is not None and value not in NEUTRAL[key]:
            raise RequestRefused(400, f"{key}={json.dumps(value)} is not supported by this server: leave it out")


def encode(policy: HFPolicy, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    """The prompt's token ids: the chat template renders ``tools`` when it can; otherwise the system message
    describes them (``text_protocol``)."""
    if not policy.native_tools:
        messages = text_protocol(messages, tools)
    try:
        return policy.encode([{**m, "content": text_content(m.get("content"))} for m in messages], tools)
    except (ValueError, TemplateError) as exc:
        raise RequestRefused(400, f"the messages cannot be rendered as a prompt: {exc}") from exc


def text_content(content: str | list[dict[str, Any]] | None) -> str:
    """A message's content as text (OpenAI allows a list of parts; only text parts mean anything here)."""
    if content is None or isinstance(content, str):
        return content or ""
    if any(part.get("type") != "text" for part in content):
        raise RequestRefused(400, "only text content parts are supported by this server")
    return "".join(str(part.get("text", "")) for part in content)


def text_protocol(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a model whose template does not render tools: the system message lists ``tools`` and how
    to call one, and earlier calls appear as the JSON the model was asked to write."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") or []
        if calls:
            written = [json.dumps({"name": c["function"]["name"], "arguments": _arguments(c)}) for c in calls]
            message = {**message, "content": "\n".join([text_content(message.get("content")), *written]).strip()}
            del message["tool_calls"]
        out.append(message)
    if not tools:
        return out
    if out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": ""})
    out[0] = {**out[0], "content": (text_content(out[0].get("content")) + "\n\n" + tools_note(tools)).strip()}
    return out


def tools_note(tools: list[dict[str, Any]]) -> str:
    """What a model whose template does not render tools is told about them, in the system message."""
    head = 'To call a tool, reply with one JSON object {"name": NAME, "arguments": {...}}. Tools:'
    return "\n".join([head, *(tool_signature(tool) for tool in tools)])


def _arguments(call: dict[str, Any]) -> Any:
    try:
        return json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError as exc:
        raise RequestRefused(400, f"the arguments of tool call {call.get('id')!r} are not JSON: {exc}") from exc


def new_token_limit(req: ChatRequest, policy: HFPolicy, prompt_tokens: int) -> int:
    """How many tokens the reply may take: what was asked (at most the server's cap), within the context."""
    asked = req.max_completion_tokens or req.max_tokens
    limit = min(asked or policy.max_new_tokens, policy.max_new_tokens)
    room = policy.context_tokens - prompt_tokens
    if room < 1 or (asked is not None and limit > room):
        raise RequestRefused(
            400,
            f"This model's maximum context length is {policy.context_tokens} tokens. However, you requested "
            f"{prompt_tokens + limit} tokens ({prompt_tokens} in the messages, {limit} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    return min(limit, room)


def assistant_message(text: str, parse_tools: bool) -> dict[str, Any]:
    """The reply as an assistant message: with ``parse_tools``, a text holding a valid tool call (``text_call``)
    becomes that call, its prose before the call the content (None when empty); otherwise the text is the
    content."""
    if parse_tools:
        prose, action = text_call(text)
        if action.tool != INVALID_TOOL:
            call = {"name": action.tool, "arguments": json.dumps(action.args)}
            tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": call}]
            return {"role": "assistant", "content": prose or None, "tool_calls": tool_calls}
    return {"role": "assistant", "content": text, "tool_calls": []}


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content``: one entry per sampled token, its text and UTF-8 bytes as vLLM gives them."""
    entries = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        token = tokenizer.decode([token_id])
        entries.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return entries


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "code": status}}


def make_app(host: ModelHost, max_body_bytes: int = MAX_BODY_BYTES) -> Any:
    """The routes. Endpoints are plain functions: FastAPI runs them in its thread pool, concurrently."""
    app = FastAPI(title="trialforge inference server", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestRefused)
    async def refused(request: Request, exc: RequestRefused) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message), status_code=exc.status)

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        data = [{"id": s.name, "object": "model", "owned_by": "trialforge", "root": s.root, "parent": s.parent,
                 "max_model_len": s.policy.context_tokens} for s in host.listing()]  # fmt: skip
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatRequest) -> dict[str, Any]:
        return complete(host.get(req.model), req)

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    def load_lora_adapter(req: LoadLora) -> str:
        host.load_adapter(req.lora_name, Path(req.lora_path))
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    def unload_lora_adapter(req: UnloadLora) -> str:
        host.unload_adapter(req.lora_name)
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."

    @app.get("/get_model_info")
    def get_model_info() -> dict[str, Any]:
        path = str(Path(host.get(host.base).root).resolve())
        return {"model_path": path, "tokenizer_path": path, "is_generation": True}

    @app.post("/update_weights_from_disk")
    def update_weights_from_disk(req: UpdateWeights) -> JSONResponse:
        try:
            host.update_weights(Path(req.model_path))
        except RequestRefused as exc:
            return JSONResponse({"success": False, "message": exc.message}, status_code=400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights from {req.model_path}."})

    return BodyCap(app, max_body_bytes, error_body)


@contextlib.contextmanager
def running(host: ModelHost, address: str, port: int) -> Iterator[str]:
    """The server in a thread of this process until the block ends; yields its base URL (``http://H:P/v1``).

    The socket is bound first, so port 0 works and the URL is known before the first request."""
    sock = bind(address, port, "the inference server listens on %s, beyond this machine, and asks no credentials")
    config = uvicorn.Config(make_app(host), log_config=None, log_level="warning", access_log=False, lifespan="off")
    with in_thread(config, sock, "inference server") as url:
        yield f"{url}/v1"
