"""Renders every case in cases.json with transformers' own chat-template machinery and writes expected.json.

Run with a Python that has transformers (5.25 was used): `python make_expected.py`. The cases fix `date_string`
where a template would read the clock, so the renderings do not depend on the day they were made.
"""

import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

here = pathlib.Path(__file__).parent
cases = json.loads((here / "cases.json").read_text())
out = {"transformers": transformers.__version__, "cases": []}
for case in cases:
    template = (here / f"{case['template']}.jinja").read_text()
    kwargs = dict(case.get("special", {}))
    kwargs.update(case.get("kwargs", {}))
    try:
        text = render_jinja_template(
            conversations=[case["messages"]],
            tools=case.get("tools"),
            chat_template=template,
            add_generation_prompt=case.get("add_generation_prompt", False),
            **kwargs,
        )
        if isinstance(text, tuple):
            text = text[0]
        if isinstance(text, list):
            text = text[0]
        out["cases"].append({"name": case["name"], "rendered": text})
    except Exception as e:  # noqa: BLE001 - the error text is the expectation
        out["cases"].append({"name": case["name"], "error": str(e)})
(here / "expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {len(out['cases'])} cases")
