"""`localspec serve`: an OpenAI- (Chat Completions, Responses), Anthropic- and Ollama-compatible HTTP server over
one loaded pipeline: one generation core, one thin adapter per protocol (parse its request into a
GenerationRequest, render the core's events).

core.py      the generation core: start a job, read it as typed events (text, reasoning, tool calls, the end)
requests.py  a request body -> prompt tokens, GenerationConfig, drafter method, stop strings
errors.py    one APIError, made in one place from bad bodies and localspec's errors; each protocol's error shape
openai_routes.py  OpenAI's Chat Completions and Completions (and /v1/models, /tokenize, /detokenize)
schemas.py   their request bodies (pydantic, strict types; unknown fields ignored, as OpenAI-compatible servers do)
responses.py their response and chunk bodies, with the run's speculative `timings`
anthropic.py Anthropic's Messages API (/v1/messages, count_tokens) translated onto the chat path
anthropic_schemas.py  its request bodies
responses_api.py  OpenAI's Responses API (/v1/responses) translated onto the chat path, its output items and events
responses_schemas.py  its request bodies
response_store.py  the stored responses (store, previous_response_id), the most recent in memory
ollama.py    Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/pull, refusals)
ollama_requests.py  an Ollama request -> the chat or completion request it asks for (options, think, names)
ollama_schemas.py   its request bodies
ollama_models.py    the served model as Ollama describes one (details, model_info, capabilities, digest)
ollama_pull.py      /api/pull as `localspec pull` for the catalog's pairs, with Ollama's status lines
tools/       tool calls: the call formats, reading calls out of an answer as it streams, the call grammars
tool_requests.py  a chat request's tools, read and checked
stops.py     stop strings over a text stream, holding back what could still become one
reasoning.py a reasoning model's <think> block split from the answer as it streams (reasoning_content)
scheduler.py one generation at a time on a worker thread, a bounded FIFO queue, cancellation
parallel_scheduler.py  several at once (--parallel N)
notes.py     the rule for fields that cannot be honoured, and the `warnings` a response carries
metrics.py   Prometheus counters (vLLM-like names)
app.py       the Starlette/FastAPI app: mounts the adapters, errors by protocol, API key, body limit, CORS
vllm.py      the equivalent `vllm serve` command for a catalog pair
"""
