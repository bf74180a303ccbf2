"""mlx_lm.server 0.32.2's HTTP face over scripted generations, for suites/serve/tools.test.ts.

Runs mlx-lm's own APIHandler (request parsing, validation, handle_completion: the text state
machine, tool-call collection, the gemma4 parser, ToolCallFormatter, the response bodies and SSE
chunks) through mlx-lm's own _run_http_server. Only the model's choice of tokens is replaced: the
ResponseGenerator below builds each request's context with mlx-lm's own
ResponseGenerator._tokenize and _make_state_machine on the checkpoint's tokenizer, then yields the
next script's token ids instead of sampling, each with its text from mlx-lm's streaming
detokenizer as the batched path produces it (the finishing "stop" token adds no text; "length"
finalizes the detokenizer).

usage: python scripted_mlx_server.py MODEL_DIR PORT SCRIPTS_JSON
SCRIPTS_JSON: a list of {"ids": [...], "finish": "stop" | "length"}, used one per request in
order ("stop": the checkpoint's first EOS id is appended as the finishing token).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: F401,E402  (the oracle's MLX_DEVICE switch)

from mlx_lm import server as S  # noqa: E402
from mlx_lm.tokenizer_utils import load as load_tokenizer  # noqa: E402


class _Provider:
    def __init__(self, model_dir, cli_args):
        self.cli_args = cli_args
        self.processor = None
        self.model_key = (model_dir, None, None)


class ScriptedGenerator(S.ResponseGenerator):
    def __init__(self, model_dir, scripts):
        # no generation thread, no model: mlx-lm's own tokenization and state machines only
        # mlx_lm.server's argparse defaults, for the request defaults APIHandler reads
        cli_args = argparse.Namespace(
            model=model_dir,
            chat_template_args={},
            allowed_origins=["*"],
            num_draft_tokens=3,
            max_tokens=512,
            temp=0.0,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
        )
        self.model_provider = _Provider(model_dir, cli_args)
        self._state_machine_cache = {}
        self.tokenizer = load_tokenizer(Path(model_dir))
        self.scripts = list(scripts)

    def generate(self, request, args, progress_callback=None):
        tok = self.tokenizer
        prompt, _, _, initial_state, _ = self._tokenize(tok, request, args)
        _, text_sm = self._make_state_machine(
            self.model_provider.model_key, tok, args.stop_words
        )
        ctx = S.GenerationContext(
            has_thinking=tok.has_thinking,
            has_tool_calling=tok.has_tool_calling,
            tool_parser=tok.tool_parser,
            text_sm=text_sm,
            initial_state=initial_state,
            prompt=prompt,
            prompt_cache_count=0,
        )
        script = self.scripts.pop(0)
        ids = list(script["ids"])
        if script["finish"] == "stop":
            ids.append(sorted(tok.eos_token_ids)[0])

        def responses():
            detok = tok.detokenizer
            detok.reset()
            for i, t in enumerate(ids):
                finish = script["finish"] if i == len(ids) - 1 else None
                if finish != "stop":
                    detok.add_token(t)
                if finish is not None:
                    detok.finalize()
                yield S.Response(detok.last_segment, t, 0.0, finish, ())

        return ctx, responses()

    @property
    def is_healthy(self):
        return True

    def stop_and_join(self):
        pass


def main():
    model_dir, port, scripts_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    scripts = json.loads(Path(scripts_file).read_text())
    S._run_http_server("127.0.0.1", port, ScriptedGenerator(model_dir, scripts))


if __name__ == "__main__":
    main()
