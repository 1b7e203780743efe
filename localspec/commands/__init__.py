"""One module per CLI command. Each defines `add_parser(subparsers)` and `run(args) -> int`, and keeps
heavy imports (llama_cpp, mlx, textual) inside `run` so `localspec --help` stays fast."""
