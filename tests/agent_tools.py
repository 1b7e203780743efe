"""Tool definitions shaped like a coding agent's (Anthropic's `tools` shape: name, description, input_schema),
written for these tests: the names and JSON-schema keywords such agents send (draft-07 `$schema`,
`additionalProperties: false`, `propertyNames`, `format: "uri"`, enums, nested arrays, `uniqueItems`),
the wording our own. `UNENFORCED` says which tools carry a keyword the grammar cannot enforce."""

from __future__ import annotations

from typing import Any

DRAFT7 = "http://json-schema.org/draft-07/schema#"


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    schema = {"$schema": DRAFT7, "type": "object", "properties": properties, "required": required,
              "additionalProperties": False, **extra}  # fmt: skip
    return {"name": name, "description": description, "input_schema": schema}


def _str(description: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **kw}


TODO = {"type": "object", "properties": {
    "content": _str("What to do", minLength=1),
    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
    "activeForm": _str("The same, as an ongoing action", minLength=1)},
    "required": ["content", "status", "activeForm"], "additionalProperties": False}  # fmt: skip
EDIT = {"type": "object", "properties": {"old_string": _str("Text to replace"), "new_string": _str("Its replacement"),
                                         "replace_all": {"type": "boolean", "default": False}},
        "required": ["old_string", "new_string"], "additionalProperties": False}  # fmt: skip
STRING_MAP = {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "string"}}
QUESTION = {"type": "object", "properties": {
    "question": _str("The question to put to the user"),
    "header": _str("A short label", maxLength=12),
    "options": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {
        "label": _str("An answer to choose"), "description": _str("What choosing it means")},
        "required": ["label", "description"], "additionalProperties": False}},
    "multiSelect": {"type": "boolean"}},
    "required": ["question", "header", "options", "multiSelect"], "additionalProperties": False}  # fmt: skip

AGENT_TOOLS: list[dict[str, Any]] = [
    _tool("Bash", "Runs a shell command in the project and returns what it printed.",
          {"command": _str("The command line"), "timeout": {"type": "number", "description": "Milliseconds",
                                                             "exclusiveMinimum": 0, "maximum": 600000},
           "description": _str("Five to ten words on what it does"),
           "run_in_background": {"type": "boolean"}}, ["command"]),
    _tool("BashOutput", "Reads new output of a command started in the background.",
          {"bash_id": _str("Which background command"), "filter": _str("A regular expression the lines must match",
                                                                        format="regex")}, ["bash_id"]),
    _tool("KillShell", "Stops a background command.", {"shell_id": _str("Which one")}, ["shell_id"]),
    _tool("Read", "Reads a file, with line numbers.",
          {"file_path": _str("Absolute path"), "offset": {"type": "integer", "minimum": 0},
           "limit": {"type": "integer", "exclusiveMinimum": 0}}, ["file_path"]),
    _tool("Write", "Writes a whole file.", {"file_path": _str("Absolute path"), "content": _str("The text")},
          ["file_path", "content"]),
    _tool("Edit", "Replaces a unique piece of text in a file.",
          {"file_path": _str("Absolute path"), **EDIT["properties"]}, ["file_path", "old_string", "new_string"]),
    _tool("MultiEdit", "Several edits to one file, applied in order.",
          {"file_path": _str("Absolute path"), "edits": {"type": "array", "minItems": 1, "items": EDIT}},
          ["file_path", "edits"]),
    _tool("Glob", "Finds files by a glob pattern.", {"pattern": _str("e.g. src/**/*.py"),
                                                     "path": _str("Where to look")}, ["pattern"]),
    _tool("Grep", "Searches file contents with a regular expression.",
          {"pattern": _str("The expression"), "path": _str("File or folder"), "glob": _str("Files to search"),
           "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
           "-i": {"type": "boolean"}, "-n": {"type": "boolean"}, "-A": {"type": "number"},
           "head_limit": {"type": "number"}, "multiline": {"type": "boolean"}}, ["pattern"]),
    _tool("LS", "Lists a folder.", {"path": _str("Absolute path"),
                                    "ignore": {"type": "array", "items": {"type": "string"}}}, ["path"]),
    _tool("WebFetch", "Fetches a page and answers a question about it.",
          {"url": _str("The page", format="uri"), "prompt": _str("What to find in it")}, ["url", "prompt"]),
    _tool("WebSearch", "Searches the web.",
          {"query": _str("Search terms", minLength=2),
           "allowed_domains": {"type": "array", "items": {"type": "string"}},
           "blocked_domains": {"type": "array", "items": {"type": "string"}}}, ["query"]),
    _tool("TodoWrite", "Keeps the task list of this session.",
          {"todos": {"type": "array", "items": TODO, "description": "The whole list"}}, ["todos"]),
    _tool("Task", "Hands a self-contained task to a helper agent.",
          {"description": _str("Three to five words"), "prompt": _str("The task"),
           "subagent_type": _str("Which kind of helper"), "env": {**STRING_MAP, "description": "Extra variables"}},
          ["description", "prompt", "subagent_type"]),
    _tool("NotebookEdit", "Replaces, inserts or deletes a notebook cell.",
          {"notebook_path": _str("Absolute path"), "cell_id": _str("Which cell"), "new_source": _str("Its source"),
           "cell_type": {"type": "string", "enum": ["code", "markdown"]},
           "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]}},
          ["notebook_path", "new_source"]),
    _tool("ExitPlanMode", "Presents the plan and asks to start.", {"plan": _str("The plan, in Markdown")}, ["plan"]),
    _tool("AskUserQuestion", "Asks the user to choose between options.",
          {"questions": {"type": "array", "minItems": 1, "maxItems": 4, "items": QUESTION},
           "answers": {**STRING_MAP, "description": "Answers already given"}}, ["questions"]),
    _tool("Skill", "Runs one of the installed skills.", {"command": _str("The skill's name")}, ["command"]),
    _tool("SlashCommand", "Runs a slash command.", {"command": _str("e.g. /review 12")}, ["command"]),
    _tool("ListMcpResources", "Lists what the connected servers offer.", {"server": _str("One server's name")}, []),
    _tool("ReadMcpResource", "Reads one resource of a connected server.",
          {"server": _str("The server"), "uri": _str("The resource", format="uri-reference")}, ["server", "uri"]),
    _tool("SetEnv", "Sets environment variables for later commands.",
          {"variables": {"type": "object", "propertyNames": {"pattern": "^[A-Z_][A-Z0-9_]*$"},
                         "additionalProperties": {"type": "string"}},
           "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}, ["variables"]),
]  # fmt: skip

# The keywords of each tool that constrain and that the grammar cannot enforce (the rest constrains nothing
# or is enforced): propertyNames {"type": "string"} and the unknown formats (regex, uri-reference) are not here.
UNENFORCED = {"SetEnv": ("propertyNames", "uniqueItems")}
