"""``trnqwen chat``: a terminal conversation with a model, in this process or through an endpoint.

session.py (the conversation, its commands and the read-answer loop; no model), local.py (an export
loaded with transformers, answers streamed by its TextIteratorStreamer from a generation thread),
endpoint.py (an OpenAI-compatible server's /v1/chat/completions with ``stream: true``, read as
server-sent events), engines.py (which of the two a command line asks for).
"""
