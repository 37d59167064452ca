"""mistral-common's own counts, for the tests that compare ctx's Mistral counter with them.

Run by the Python of the venv setup.sh makes for mistral-common (never by ctx's own, which
does not have it), with a JSON request on stdin and the answer on stdout:

    {"tokenizer": PATH, "chats": [[{"role", "content"}, ...], ...], "texts": [TEXT, ...]}
    -> {"version": "v3", "chats": [N, ...], "texts": [N, ...], "shown": [TEXT, ...]}

A chat's N is `len(encode_chat_completion(ChatCompletionRequest(messages=chat)).tokens)`;
`shown` is the same tokens decoded with their control tokens kept, for a failure to show. A
text's N is the tokenizer's own count of it as plain text (no BOS or EOS, no control tokens).
"""

from __future__ import annotations

import json
import sys
import warnings

from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

ROLES = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}


def main() -> None:
    warnings.simplefilter("ignore")
    asked = json.load(sys.stdin)
    mistral = MistralTokenizer.from_file(asked["tokenizer"])
    inner = mistral.instruct_tokenizer.tokenizer
    counts, shown = [], []
    for chat in asked.get("chats", []):
        messages = [ROLES[m["role"]](content=m["content"]) for m in chat]
        tokens = mistral.encode_chat_completion(ChatCompletionRequest(messages=messages)).tokens
        counts.append(len(tokens))
        shown.append(inner.decode(tokens, special_token_policy=SpecialTokenPolicy.KEEP))
    texts = [len(inner.encode(text, bos=False, eos=False)) for text in asked.get("texts", [])]
    json.dump({"version": str(inner.version.value), "chats": counts, "texts": texts, "shown": shown}, sys.stdout)


if __name__ == "__main__":
    main()
