"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pipeline.

schemas.py   request bodies (pydantic, strict types; unknown fields ignored, as OpenAI-compatible servers do)
errors.py    OpenAI-shaped error bodies and the exceptions that carry them
requests.py  a request body -> prompt tokens, GenerationConfig, drafter method, stop strings
stops.py     stop strings over a text stream, holding back what could still become one
reasoning.py a reasoning model's <think> block split from the answer as it streams (reasoning_content)
scheduler.py one generation at a time on a worker thread, a bounded FIFO queue, cancellation
responses.py OpenAI response and chunk bodies, with the run's speculative `timings`
notes.py     the rule for fields that cannot be honoured, and the `warnings` a response carries
metrics.py   Prometheus counters (vLLM-like names)
app.py       the Starlette/FastAPI app: routes, API key, body limit, CORS
anthropic.py Anthropic's Messages API (/v1/messages, count_tokens) translated onto the chat path
anthropic_schemas.py  its request bodies
vllm.py      the equivalent `vllm serve` command for a catalog pair
"""
