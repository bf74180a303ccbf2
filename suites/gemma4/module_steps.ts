// Module steps (freeze/unfreeze/train/eval on a named module) applied as the oracle's
// fresh_model applies them (oracle/python/server.py), shared by the training-API suites.
import type { Module } from "../../model/gemma4/nn.ts";

export interface ModuleStep {
  op: "freeze" | "unfreeze" | "train" | "eval";
  path?: string;
  recurse?: boolean;
  keys?: string | string[];
  strict?: boolean;
  mode?: boolean;
}

export function applySteps(model: Module, steps: readonly ModuleStep[]): void {
  const named = new Map(model.namedModules());
  for (const st of steps) {
    const m = named.get(st.path ?? "");
    if (!m) throw new Error(`no module ${st.path}`);
    if (st.op === "freeze" || st.op === "unfreeze") m[st.op]({ recurse: st.recurse, keys: st.keys, strict: st.strict });
    else if (st.op === "train") m.train(st.mode ?? true);
    else m.eval();
  }
}
