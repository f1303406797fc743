"""The OpenAI-compatible HTTP surface: one module per endpoint family (``completions``,
``chat``, ``models``, ``tokenization``), and what they share: the request models
(``protocol``), the error envelope (``errors``), the FastAPI app and body reader (``api``),
server-sent events (``sse``), the choices' text (``choices``), ``logprobs``, the sampling
translation (``sampling``) and tool calling (``tool_calls``)."""
