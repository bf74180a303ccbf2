// Golden regeneration (the command face is parity/golden_regen_cli.ts: npm run golden:regen):
// rebuilds the fixture checkpoints (cached, stamp-checked), captures every planned
// (checkpoint, scenario) with the live oracle into a temp dir, writes golden/manifest.json,
// prints a readable diff against the previous goldens, then swaps the new tree into place
// (rename), so an interrupted run leaves the old goldens untouched.

import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { OracleClient, REPO_ROOT } from "./client.ts";
import { CROSS_PLATFORM_NOTE, GOLDEN_DIR, type GoldenEntry, type Manifest, readManifest, sha256 } from "./golden.ts";
import { diffGoldens } from "./golden_diff.ts";

const PLAN_PATH = join(REPO_ROOT, "oracle", "golden_plan.json");
const TAPS_PATH = join(REPO_ROOT, "oracle", "taps.json");
const MAX_BYTES = 40 * 1000 * 1000;

interface Rule {
  checkpoints: string[];
  scenarios: string[];
}
interface Plan {
  full: Rule[];
  logits: Rule[];
}
interface PlanItem {
  id: string;
  checkpoint: string;
  scenario: string;
  mode: "full" | "logits";
}

/** '*' matches anything (including '/'), '?' one char; a leading '!' negates. */
export function globMatch(glob: string, s: string): boolean {
  if (glob.startsWith("!")) return !globMatch(glob.slice(1), s);
  const re = new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*+/g, ".*").replace(/\?/g, ".")}$`);
  return re.test(s);
}

const matches = (rule: Rule, ck: string, sc: string) =>
  rule.checkpoints.some((g) => globMatch(g, ck)) && rule.scenarios.some((g) => globMatch(g, sc));

/**
 * Text checkpoints ({moe}) take the text scenarios ({applies_to}); multimodal checkpoints
 * ({towers}) take the multimodal scenarios whose towers ({needs}) they have, within their family
 * (gemma4_unified checkpoints, family "unified", take only the unified scenarios, and back).
 */
export function buildPlan(
  plan: Plan,
  checkpoints: { id: string; moe?: boolean; towers?: string[]; family?: string }[],
  scenarios: { id: string; applies_to?: string; needs?: string[]; family?: string }[],
): PlanItem[] {
  const out: PlanItem[] = [];
  for (const ck of checkpoints) {
    for (const sc of scenarios) {
      if ((ck.towers === undefined) !== (sc.needs === undefined)) continue;
      if (ck.family !== sc.family) continue;
      if (sc.needs && !sc.needs.every((t) => ck.towers!.includes(t))) continue;
      if (sc.applies_to === "moe" && !ck.moe) continue;
      const mode = plan.full.some((r) => matches(r, ck.id, sc.id))
        ? "full"
        : plan.logits.some((r) => matches(r, ck.id, sc.id))
          ? "logits"
          : undefined;
      if (mode) out.push({ id: `${ck.id}/${sc.id}`, checkpoint: ck.id, scenario: sc.id, mode });
    }
  }
  return out;
}

interface Unit {
  /** golden/<key>.npz + golden/<key>.json */
  key: string;
  checkpoint: string;
  items: PlanItem[];
  /** Several scenarios share the file: tap names get a "<scenario>/" prefix. */
  prefix: boolean;
}

/** One file per full dump; all logits-only scenarios of a checkpoint share `<checkpoint>/logits`. */
export function groupUnits(items: PlanItem[]): Unit[] {
  const units: Unit[] = [];
  const logits = new Map<string, Unit>();
  for (const p of items) {
    if (p.mode === "full") {
      units.push({ key: p.id, checkpoint: p.checkpoint, items: [p], prefix: false });
      continue;
    }
    let u = logits.get(p.checkpoint);
    if (!u) {
      u = { key: `${p.checkpoint}/logits`, checkpoint: p.checkpoint, items: [], prefix: true };
      logits.set(p.checkpoint, u);
      units.push(u);
    }
    u.items.push(p);
  }
  return units;
}

/** A selection that matches no planned entry (the face reports it as bad usage). */
export class GoldenSelectionError extends Error {
  override readonly name = "GoldenSelectionError";
}

export interface RegenOptions {
  /** Regenerate only entries whose id matches one of these globs (globMatch); all when empty. */
  only: readonly string[];
  /** Print the plan and return. */
  dryRun: boolean;
}

class Progress {
  private readonly tty = Boolean(process.stderr.isTTY);
  private last = "";
  constructor(private readonly total: number) {}
  update(done: number, label: string): void {
    const width = 28;
    const fill = Math.round((done / Math.max(1, this.total)) * width);
    const bar = `[${"#".repeat(fill)}${".".repeat(width - fill)}] ${String(done).padStart(String(this.total).length)}/${this.total} ${label}`;
    if (this.tty) process.stderr.write(`\r${bar.padEnd(this.last.length)}`);
    this.last = bar;
  }
  line(s: string): void {
    if (this.tty) process.stderr.write(`\r${" ".repeat(this.last.length)}\r`);
    process.stderr.write(`${s}\n`);
    if (this.tty && this.last) process.stderr.write(this.last);
  }
  end(): void {
    if (this.tty) process.stderr.write("\n");
  }
}

/** Temp trees left by interrupted runs (their process is gone) are removed; golden/ was never touched. */
function removeStaleTemps(): void {
  const cache = join(REPO_ROOT, ".cache");
  if (!existsSync(cache)) return;
  for (const name of readdirSync(cache)) {
    const m = /^golden-(?:tmp|old)-(\d+)$/.exec(name);
    if (!m) continue;
    let alive = true;
    try {
      process.kill(Number(m[1]), 0);
    } catch {
      alive = false;
    }
    if (!alive) rmSync(join(cache, name), { recursive: true, force: true });
  }
}

function manifestText(m: Manifest): string {
  const lines = ["{"];
  const keys = Object.keys(m) as (keyof Manifest)[];
  keys.forEach((k, n) => {
    const comma = n === keys.length - 1 ? "" : ",";
    const v = m[k];
    if ((k === "entries" || k === "checkpoints") && v && typeof v === "object") {
      const ents = Object.entries(v as Record<string, unknown>);
      lines.push(`  ${JSON.stringify(k)}: {`);
      ents.forEach(([id, e], j) => lines.push(`    ${JSON.stringify(id)}: ${JSON.stringify(e)}${j === ents.length - 1 ? "" : ","}`));
      lines.push(`  }${comma}`);
    } else {
      lines.push(`  ${JSON.stringify(k)}: ${JSON.stringify(v)}${comma}`);
    }
  });
  lines.push("}");
  return `${lines.join("\n")}\n`;
}

/** Regenerates golden/ (or prints the plan with dryRun); returns the exit status. */
export async function regenerateGoldens(args: RegenOptions): Promise<number> {
  const t0 = Date.now();
  const planSpec = JSON.parse(readFileSync(PLAN_PATH, "utf8")) as Plan;
  removeStaleTemps();
  const oracle = await OracleClient.start({ requestTimeoutMs: 600_000 });
  const tmp = join(REPO_ROOT, ".cache", `golden-tmp-${process.pid}`);
  let swapped = false;
  try {
    const { versions, fingerprint } = await oracle.fingerprint();
    const planInfo = await oracle.request<{
      checkpoints: { id: string; moe: boolean }[];
      scenarios: { id: string; applies_to: string }[];
      mm_checkpoints: { id: string; towers: string[] }[];
      mm_scenarios: { id: string; needs: string[] }[];
      unified_checkpoints: { id: string; towers: string[] }[];
      unified_scenarios: { id: string; needs: string[] }[];
    }>("plan");
    const unified = { family: "unified" } as const;
    const all = buildPlan(
      planSpec,
      [...planInfo.checkpoints, ...planInfo.mm_checkpoints, ...planInfo.unified_checkpoints.map((c) => ({ ...c, ...unified }))],
      [...planInfo.scenarios, ...planInfo.mm_scenarios, ...planInfo.unified_scenarios.map((s) => ({ ...s, ...unified }))],
    );
    const selected = args.only.length ? all.filter((p) => args.only.some((g) => globMatch(g, p.id))) : all;
    const nFull = selected.filter((p) => p.mode === "full").length;
    console.error(`plan: ${all.length} entries (${all.filter((p) => p.mode === "full").length} full); regenerating ${selected.length} (${nFull} full)`);
    if (args.dryRun) {
      for (const p of selected) console.log(`${p.mode.padEnd(6)} ${p.id}`);
      return 0;
    }
    if (selected.length === 0) throw new GoldenSelectionError(`--only ${args.only.join(" ")} matches no planned entry`);

    const ckIds = [...new Set(selected.map((p) => p.checkpoint))];
    console.error(`checkpoints: ensuring ${ckIds.length} (built into .cache/checkpoints when missing or stale)`);
    const ckIndex = (await oracle.request<{ index: { seed: number; checkpoints: Manifest["checkpoints"] } }>("make_checkpoints", { only: ckIds })).index;

    const old = readManifest();
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    const units = groupUnits(all);
    const selectedIds = new Set(selected.map((p) => p.id));
    const todo = units.filter((u) => u.items.some((p) => selectedIds.has(p.id)));
    const entries: Record<string, GoldenEntry> = {};
    const files: Manifest["files"] = {};
    // carry over the files --only leaves alone
    for (const u of units) {
      if (todo.includes(u)) continue;
      for (const p of u.items) {
        const e = old?.entries[p.id];
        if (!e || e.mode !== p.mode || e.npz !== `${u.key}.npz`) {
          throw new Error(`entry ${p.id} is not in the current goldens in this form; run without --only (or include it)`);
        }
        entries[p.id] = e;
      }
      for (const f of [`${u.key}.npz`, `${u.key}.json`]) {
        const o = old?.files[f];
        if (!o) throw new Error(`golden file ${f} missing from the current manifest; run without --only`);
        mkdirSync(dirname(join(tmp, f)), { recursive: true });
        copyFileSync(join(GOLDEN_DIR, f), join(tmp, f));
        files[f] = o;
      }
    }

    const progress = new Progress(todo.reduce((a, u) => a + u.items.length, 0));
    let lastCk = "";
    let n = 0;
    for (const u of todo) {
      if (u.checkpoint !== lastCk) {
        lastCk = u.checkpoint;
        progress.line(`[${((Date.now() - t0) / 1000).toFixed(0)}s] ${u.checkpoint}`);
      }
      progress.update(n, `${u.key} (${u.items.length} scenario${u.items.length > 1 ? "s" : ""})`);
      mkdirSync(dirname(join(tmp, u.key)), { recursive: true });
      const r = await oracle.request<{
        npz_sha256: string;
        npz_bytes: number;
        index_sha256: string;
        index_bytes: number;
        scenarios: { scenario: string; mode: string; taps: number; stored: number; same_as: string | null }[];
      }>("golden", {
        checkpoint: u.checkpoint,
        items: u.items.map((p) => ({ scenario: p.scenario, mode: p.mode })),
        prefix: u.prefix,
        npz: join(tmp, `${u.key}.npz`),
        index: join(tmp, `${u.key}.json`),
      });
      files[`${u.key}.npz`] = { sha256: r.npz_sha256, bytes: r.npz_bytes };
      files[`${u.key}.json`] = { sha256: r.index_sha256, bytes: r.index_bytes };
      u.items.forEach((p, k) => {
        const s = r.scenarios[k];
        if (!s || s.scenario !== p.scenario) throw new Error(`oracle answered ${s?.scenario} for ${p.id}`);
        entries[p.id] = {
          checkpoint: p.checkpoint,
          scenario: p.scenario,
          mode: p.mode,
          npz: `${u.key}.npz`,
          index: `${u.key}.json`,
          prefix: u.prefix ? `${s.same_as ?? p.scenario}/` : "",
          taps: s.taps,
          stored: s.stored,
          ...(s.same_as ? { same_as: s.same_as } : {}),
        };
      });
      n += u.items.length;
      progress.update(n, u.key);
    }
    progress.end();

    const ordered: Record<string, GoldenEntry> = {};
    for (const p of all) ordered[p.id] = entries[p.id] as GoldenEntry;
    const sortedFiles: Manifest["files"] = {};
    for (const k of Object.keys(files).sort()) sortedFiles[k] = files[k] as Manifest["files"][string];
    const checkpoints: Manifest["checkpoints"] = {};
    for (const id of [...new Set(all.map((p) => p.checkpoint))]) {
      const c = ckIndex.checkpoints[id] ?? old?.checkpoints[id];
      if (!c) throw new Error(`no checkpoint index entry for ${id}`);
      checkpoints[id] = c;
    }
    const total = Object.values(sortedFiles).reduce((a, f) => a + f.bytes, 0);
    const manifest: Manifest = {
      format: 1,
      generated_by: "npm run golden:regen (parity/golden_regen_cli.ts, oracle/golden_regen.ts)",
      versions,
      fingerprint,
      cross_platform: { note: CROSS_PLATFORM_NOTE },
      taps_json_sha256: sha256(new Uint8Array(readFileSync(TAPS_PATH))),
      plan: planSpec,
      checkpoints,
      files: sortedFiles,
      entries: ordered,
      full_dumps: all.filter((p) => p.mode === "full").map((p) => p.id),
      logits_only: all.filter((p) => p.mode === "logits").map((p) => p.id),
      total_bytes: 0,
    };
    // total = data files + the manifest itself (its size includes this number; two passes settle it)
    manifest.total_bytes = total + Buffer.byteLength(manifestText(manifest));
    manifest.total_bytes = total + Buffer.byteLength(manifestText(manifest));
    writeFileSync(join(tmp, "manifest.json"), manifestText(manifest));
    if (manifest.total_bytes > MAX_BYTES) {
      const full = Object.entries(sortedFiles).filter(([k]) => !k.endsWith("/logits.npz") && !k.endsWith("/logits.json")).reduce((a, [, f]) => a + f.bytes, 0);
      throw new Error(
        `golden set would be ${(manifest.total_bytes / 1e6).toFixed(1)} MB > 40 MB (full dumps ${(full / 1e6).toFixed(1)} MB, logits groups ${((total - full) / 1e6).toFixed(1)} MB); trim oracle/golden_plan.json`,
      );
    }

    console.log(diffGoldens(old, manifest, GOLDEN_DIR, tmp).join("\n"));

    const bak = join(REPO_ROOT, ".cache", `golden-old-${process.pid}`);
    if (existsSync(GOLDEN_DIR)) renameSync(GOLDEN_DIR, bak);
    renameSync(tmp, GOLDEN_DIR);
    swapped = true;
    rmSync(bak, { recursive: true, force: true });
    const mb = (statSync(join(GOLDEN_DIR, "manifest.json")).size / 1e6).toFixed(2);
    console.error(
      `golden/: ${Object.keys(ordered).length} entries, ${(manifest.total_bytes / 1e6).toFixed(2)} MB (manifest ${mb} MB), ${((Date.now() - t0) / 1000).toFixed(1)}s`,
    );
    return 0;
  } finally {
    if (!swapped) rmSync(tmp, { recursive: true, force: true });
    await oracle.close();
  }
}
