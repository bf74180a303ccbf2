"""Reference for suites/gemma4/config.test.ts: mlx-lm's own ModelArgs for each config on stdin.

stdin: JSON list of config dicts; stdout: JSON list of {"layout", "args"} with the text model's
ModelArgs after __post_init__ (dataclasses.asdict), or {"error": "..."}.
Resolution as mlx_lm.utils.load_model does it: MODEL_REMAPPING, gemma4 wrapper text_config.
"""
import dataclasses
import json
import sys

from mlx_lm.models import gemma4, gemma4_text
from mlx_lm.utils import MODEL_REMAPPING

out = []
for cfg in json.load(sys.stdin):
    try:
        mt = MODEL_REMAPPING.get(cfg["model_type"], cfg["model_type"])
        if mt == "gemma4":
            w = gemma4.ModelArgs.from_dict(json.loads(json.dumps(cfg)))
            args = gemma4_text.ModelArgs.from_dict(w.text_config)
            out.append({"layout": "gemma4", "args": dataclasses.asdict(args)})
        elif mt == "gemma4_text":
            out.append({"layout": "gemma4_text", "args": dataclasses.asdict(gemma4_text.ModelArgs.from_dict(cfg))})
        else:
            out.append({"error": f"unsupported {mt}"})
    except Exception as e:  # noqa: BLE001
        out.append({"error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
