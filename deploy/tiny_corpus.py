"""The built-in training text of the ``agent`` tiny tokenizer (deploy/tiny_model.py).

Written for this project: the kinds of text agent clients send (instructions in English and
Markdown, JSON tool schemas and messages, shell commands, code) and ordinary English prose, so
that a byte-level BPE trained on it needs well under one token per byte for such prompts. Any
edit changes the tokenizer (the text is part of the model's recipe).
"""

from __future__ import annotations

import json
import re
from typing import Final

_INSTRUCTIONS: Final = """\
You are a coding agent running in a terminal on the user's computer. You help the user by reading
files, running commands, editing code and explaining what you did. Work carefully and keep the user
informed about what you are doing and why.

# General rules
- Be concise, direct and friendly. Prefer short paragraphs and bullet lists over long essays.
- Before you make a change, read the relevant files so that you understand the existing code.
- Keep changes small and focused on the task. Do not rewrite code that does not need to change.
- Follow the style of the project: naming, formatting, error handling and the structure of tests.
- When you are not sure what the user wants, ask a short question instead of guessing.
- Never invent file names, functions or command output. If you did not check it, say so.
- Do not add comments that only repeat what the code says; explain why, not what.
- If a command fails, read the error message, find the cause and fix it before you continue.
- When the task is done, summarize the result: what changed, how you tested it, what is left.

## Planning
For tasks that need several steps, write a short plan first and update it as you go. A good plan has
three to seven steps, each one a clear action that you can check off. Mark a step as completed only
when it is really finished, and tell the user when the plan changes. Simple questions do not need a
plan: answer them directly.

## Editing files
Use the apply_patch tool to edit files. A patch names each file it changes and shows the lines to
remove and the lines to add, with a few lines of context around every change. Create new files with
the full content. Do not change files that are not related to the task, and never delete the user's
work without asking. After editing, run the formatter and the linter if the project has them.

## Running commands
Use the shell tool to run commands. Set the working directory explicitly and prefer commands that
finish quickly. Search the code with rg (ripgrep) rather than grep, and read files in parts when they
are large. Commands run in a sandbox: writing outside the workspace or using the network may need
the user's approval. If a command needs approval, explain in one sentence why it is necessary.

## Testing
Run the tests that cover the code you changed. Start with the most specific test, then run the
broader suite. If there are no tests for the behaviour you changed, add one when the project has a
test framework. Do not mark the task complete while tests are failing; report failures honestly,
including the ones you could not fix.

## Final answer
Format the answer in Markdown. Use headings only when they help, code blocks for commands and code,
and backticks for file paths, function names and values. Reference files with their path and line
number, for example `src/server/app.py:42`. Keep the final message short: the user can read the diff.
"""

_PROSE: Final = """\
The history of science is full of small observations that changed the way people understood the
world. A careful experiment, repeated many times by different people, is worth more than a clever
idea that nobody has tested. Good scientists write down what they expected, what they measured and
what they concluded, so that others can check the work and build on it.

In the morning the city was quiet. A few people walked their dogs along the river, a delivery truck
stopped in front of the bakery, and the first train of the day crossed the old bridge. By nine
o'clock the streets were full of children going to school, workers going to their offices and
tourists looking for a place to have breakfast. Everyone seemed to be in a hurry, except the old
man who sat on the same bench every day and fed the birds.

Learning a new language takes time and patience. It helps to listen every day, to read simple books
and to speak without being afraid of making mistakes. Most people understand much more than they can
say, and that is normal. After a few months the words that seemed strange at first become familiar,
and one day you notice that you are thinking in the new language without translating.

The company announced its results for the third quarter on Tuesday. Revenue grew by twelve percent
compared with the same period last year, mainly because of strong demand for its cloud services.
The chief executive said that the company would continue to invest in research and development, and
that it expected the market to remain difficult during the next year because of higher costs.

Cooking at home does not have to be complicated. Start with fresh ingredients, a sharp knife and a
good pan. Cut the vegetables into pieces of the same size so that they cook evenly, add salt at the
right moment, and taste the food while it is cooking. A simple dinner of rice, vegetables and eggs can
be ready in twenty minutes and is often better than anything you could order.

Computers follow instructions exactly. That is their strength and their weakness: a program does what
it was written to do, not what its author meant. Most software problems come from the difference
between the two, which is why reading code, writing tests and asking questions are such important
parts of a programmer's job. The best engineers are not the ones who never make mistakes, but the ones
who find and fix them quickly, and who make the system easier to understand for the next person.

When the weather changes in the mountains, it changes fast. Clouds that were far away an hour ago can
bring rain, wind and cold within minutes. Experienced hikers check the forecast before they leave,
carry warm clothes and water, tell someone where they are going, and turn back when the conditions
become dangerous. Reaching the top is optional; coming home is not.

the of and to a in is it you that he was for on are with as I his they be at one have this from or
had by not word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river car feet
care second book carry took science eat room friend began idea fish mountain stop once base hear horse
cut sure watch color face wood main enough plain girl usual young ready above ever red list though
feel talk bird soon body dog family direct pose leave song measure door product black short numeral
class wind question happen complete ship area half rock order fire south problem piece told knew pass
since top whole king space heard best hour better true during hundred five remember step early hold
west ground interest reach fast verb sing listen six table travel less morning ten simple several
vowel toward war lay against pattern slow center love person money serve appear road map rain rule
govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait
plan figure star box noun field rest correct able pound done beauty drive stood contain front teach
week final gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide surface deep
moon island foot system busy test record boat common gold possible plane stead dry wonder laugh
thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant fill east
paint language among
"""

_JSON: Final = """\
{"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
 "strict": false, "parameters": {"type": "object", "properties": {"command": {"type": "array",
 "items": {"type": "string"}, "description": "The command to execute, as a list of arguments."},
 "workdir": {"type": "string", "description": "The working directory to run the command in."},
 "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds."}},
 "required": ["command"], "additionalProperties": false}}
{"type": "function", "name": "update_plan", "description": "Updates the task plan. Provide an optional
 explanation and a list of plan items, each with a step and a status. At most one step can be
 in_progress at a time.", "parameters": {"type": "object", "properties": {"explanation": {"type":
 "string"}, "plan": {"type": "array", "description": "The list of steps", "items": {"type": "object",
 "properties": {"step": {"type": "string"}, "status": {"type": "string", "description": "One of:
 pending, in_progress, completed", "enum": ["pending", "in_progress", "completed"]}}, "required":
 ["step", "status"], "additionalProperties": false}}}, "required": ["plan"]}}
{"name": "Read", "description": "Reads a file from the local filesystem. The file_path parameter must
 be an absolute path, not a relative path. By default, it reads up to 2000 lines starting from the
 beginning of the file.", "input_schema": {"type": "object", "properties": {"file_path": {"type":
 "string", "description": "The absolute path to the file to read"}, "offset": {"type": "number",
 "description": "The line number to start reading from"}, "limit": {"type": "number", "description":
 "The number of lines to read"}}, "required": ["file_path"], "additionalProperties": false,
 "$schema": "http://json-schema.org/draft-07/schema#"}}
{"name": "Edit", "description": "Performs exact string replacements in files.", "input_schema":
 {"type": "object", "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string",
 "description": "The text to replace"}, "new_string": {"type": "string", "description": "The text to
 replace it with (must be different from old_string)"}, "replace_all": {"type": "boolean", "default":
 false}}, "required": ["file_path", "old_string", "new_string"]}}
{"model": "gpt-5", "stream": true, "store": false, "tool_choice": "auto", "parallel_tool_calls": true,
 "reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"],
 "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text":
 "<permissions instructions>"}]}, {"type": "message", "role": "user", "content": [{"type":
 "input_text", "text": "Fix the failing test in the parser module."}]}, {"type": "function_call",
 "call_id": "call_1", "name": "shell", "arguments": "{\\"command\\": [\\"pytest\\", \\"-q\\"]}"},
 {"type": "function_call_output", "call_id": "call_1", "output": "1 failed, 41 passed in 2.31s"}]}
{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user",
 "content": "What is the weather in Paris today?"}, {"role": "assistant", "content": null,
 "tool_calls": [{"id": "call_abc123", "type": "function", "function": {"name": "get_weather",
 "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}}]}, {"role": "tool",
 "tool_call_id": "call_abc123", "content": "{\\"temperature\\": 21, \\"condition\\": \\"sunny\\"}"}],
 "max_tokens": 256, "temperature": 0.7, "top_p": 1.0, "n": 1, "stop": null, "user": "user-1234"}
{"id": "resp_0123456789", "object": "response", "created_at": 1741476542, "status": "completed",
 "error": null, "incomplete_details": null, "output": [{"type": "reasoning", "id": "rs_01",
 "summary": []}, {"type": "message", "id": "msg_01", "status": "completed", "role": "assistant",
 "content": [{"type": "output_text", "text": "Hello! How can I help you today?", "annotations": []}]}],
 "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 87,
 "output_tokens_details": {"reasoning_tokens": 64}, "total_tokens": 123}}
{"error": {"message": "Invalid value for 'temperature': expected a number between 0 and 2.",
 "type": "invalid_request_error", "param": "temperature", "code": "invalid_value"}}
"""

_CODE: Final = """\
$ git status --short && git diff --stat
$ rg -n "def parse_" src/ --type py | head -20
$ python -m pytest tests/unit -q -k "parser and not slow"
$ npm install && npm run build && npm test -- --watch=false
$ ls -la ~/.config && cat pyproject.toml | grep -A5 "\\[project\\]"
$ docker run --rm -p 8000:8000 -v "$PWD/models:/models" server:latest --log-level info
$ curl -s http://localhost:8000/v1/models -H "Authorization: Bearer $API_KEY" | jq .

```python
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Config:
    name: str
    path: Path
    retries: int = 3

    @classmethod
    def load(cls, file: Path) -> "Config":
        data = json.loads(file.read_text(encoding="utf-8"))
        return cls(name=data["name"], path=Path(data["path"]), retries=int(data.get("retries", 3)))


def main(argv: list[str] | None = None) -> int:
    config = Config.load(Path("config.json"))
    for attempt in range(config.retries):
        try:
            return run(config)
        except TimeoutError as exc:
            print(f"attempt {attempt + 1} failed: {exc}")
    return 1
```

```typescript
export async function fetchJson<T>(url: string, init?: RequestInit): Promise<T> {
  const response = await fetch(url, { ...init, headers: { "Content-Type": "application/json" } });
  if (!response.ok) {
    throw new Error(`request failed with status ${response.status}: ${await response.text()}`);
  }
  return (await response.json()) as T;
}
```

*** Begin Patch
*** Update File: src/app/config.py
@@ def load_settings(path):
-    return json.load(open(path))
+    with open(path, encoding="utf-8") as file:
+        return json.load(file)
*** End Patch
"""

_TECHNICAL: Final = """\
about above access account action active actual adapter address admin agent algorithm alias allow
already analysis annotation api app append application apply approval approve archive argument array
assert assistant async attribute authentication author authorization automatic available await
backend background batch before behavior binary bind block body boolean branch browser buffer bug
build builder bundle byte cache call callback cancel capacity case catch certificate change channel
character check child choice chunk class clean clear cli client clone close cloud cluster code
collection column command comment commit compare compile complete component compute concurrency
condition config configuration connect connection console constant constraint container content
context continue contract control convert copy core count create credential current cursor custom
data database date debug decimal declare decode default define definition delay delete delta
dependency deploy deployment describe description design destination detail detect developer device
diff directory disable disk display document domain download draft driver duration dynamic edit
element empty enable encode encoding encrypted endpoint engine entry enum environment error event
example exception exclude execute exist exit expect expected explain export expression extension
external extract factory fail failure false feature fetch field file filter finish first fix flag
float folder format forward frame framework function gateway generate generic global grammar graph
group guide handle handler hash header health helper hidden history host http https identifier
image implement import include incomplete index info information inherit initial input insert
inside install instance instruction integer integration interface internal interval invalid issue
item iterate job json kernel key keyword label language latency layer layout length level library
limit line link lint linter list listen load local lock log logic login lookup loop main manager
map mark match maximum memory merge message metadata method metric middleware minimum missing mock
mode model module monitor mount name namespace native network node null number object offset
option optional order origin output override owner package page parallel parameter parent parse
parser partial password patch path pattern payload pending performance permission pipeline
platform plugin pointer policy pool port position post prefix prepare preview primary print
priority private process produce production profile program project prompt property protocol
provider proxy public publish pull push query queue random range rate read reader reason reasoning
receive record recursive redirect reference refresh region register registry regular release
remote remove render replace reply repository request require required reset resolve resource
response result retry return review role root route router row rule runtime safe sample sandbox
save scan schema scope score script search secret section secure select send sequence serialize
server service session setting setup shell signal signature size skip slice snapshot socket sort
source span spec specific stack standard start state static status stderr stdin stdout step stop
storage store stream strict string structure style submit subprocess success suffix summary support
switch symbol sync syntax system table tag target task template temperature temporary terminal test
text thread throw timeout timestamp token tool total trace transaction transform tree trigger true
truncate type undefined unique unit unknown update upload upstream url usage user utf validate
validation value variable vendor verbose version view virtual visible wait warning watch web
webhook window worker workflow workspace wrapper write yaml zero
"""

_WORDS: Final = (_PROSE[_PROSE.index("the of and") :] + _TECHNICAL).split()


def _title_case_lines(words: list[str], width: int = 12) -> str:
    # Headings, titles and identifiers capitalize words that prose writes in lower case.
    titled = [w.capitalize() for w in words]
    return "\n".join(" ".join(titled[i : i + width]) for i in range(0, len(titled), width)) + "\n"


def _indented_json(text: str) -> str:
    # The same objects pretty-printed, as tool outputs and files show them. Each object of `text`
    # starts a line; its other lines start with a space.
    out = []
    for chunk in re.split(r"\n(?=\{)", text.strip()):
        obj = json.loads("".join(chunk.splitlines()))
        out.append(json.dumps(obj, indent=2))
        out.append(json.dumps(obj, indent=4, sort_keys=True))
    return "\n".join(out) + "\n"


AGENT_CORPUS: Final = "\n".join(
    (_INSTRUCTIONS, _PROSE, _TECHNICAL, _title_case_lines(_WORDS), _JSON, _indented_json(_JSON), _CODE)
)
