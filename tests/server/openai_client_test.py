#!/usr/bin/env python3
"""Drives `strata serve` with the official `openai` Python client: a chat answer, whole and
streamed, equals what `strata run --chat` printed; usage comes back in the stream; a refused
request raises the client's BadRequestError naming the field.

Usage: openai_client_test.py BASE_URL API_KEY MODEL_ID QUESTION RUN_CHAT_FILE
"""
import sys

import openai


def main():
    base, key, model, question, run_file = sys.argv[1:6]
    want = open(run_file, encoding="utf-8").read()
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, timeout=60, max_retries=0)
    messages = [{"role": "user", "content": question}]

    r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                       max_tokens=24)
    assert r.choices[0].message.content + "\n" == want, (r.choices[0].message.content, want)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage

    text, usage, finish = "", None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                max_tokens=24, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text + "\n" == want, (text, want)
    assert finish in ("stop", "length"), finish
    assert usage and usage.completion_tokens > 0, usage

    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "n", e.body
    print("ok: openai client")


if __name__ == "__main__":
    main()
