#!/usr/bin/env node
// One-command setup, idempotent: npm dependencies, the oracle's Python venv, the native shim.
// Each step is skipped when its inputs are unchanged (a content hash is stored beside the
// result), so a second run costs well under a second. Failures end with one clear message.
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const quiet = process.argv.includes("--quiet");
const isMac = process.platform === "darwin";
const log = (msg) => quiet || process.stderr.write(`[setup] ${msg}\n`);

function fail(what, how) {
  process.stderr.write(`\n[setup] error: ${what}\n[setup] ${how}\n`);
  process.exit(1);
}

const sha = (...parts) => createHash("sha256").update(parts.join("\0")).digest("hex");
const readOr = (p, d = "") => (existsSync(p) ? readFileSync(p, "utf8") : d);

function run(cmd, args, what, how, opts = {}) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: quiet ? "pipe" : ["ignore", "inherit", "inherit"], ...opts });
  if (r.error) fail(`${what}: ${r.error.message}`, how);
  if (r.status !== 0) {
    if (quiet && r.stderr) process.stderr.write(r.stderr);
    fail(`${what} (exit ${r.status})`, how);
  }
  return r;
}

function which(cmd) {
  const r = spawnSync(isMac || process.platform === "linux" ? "sh" : cmd, ["-c", `command -v ${cmd}`], { encoding: "utf8" });
  return r.status === 0 ? r.stdout.trim() : null;
}

// 1. npm dependencies (package-lock.json decides).
function npmDeps() {
  const lock = join(root, "package-lock.json");
  const stamp = join(root, "node_modules", ".setup-lock.sha256");
  const want = sha(readOr(lock));
  if (readOr(stamp) === want && existsSync(join(root, "node_modules", ".bin", "bun"))) return;
  log("installing npm dependencies (npm ci)");
  run("npm", ["ci", "--no-audit", "--no-fund"], "npm ci failed", "Check network access to the npm registry and Node >= 20 (`node --version`).");
  writeFileSync(stamp, want);
}

// The MLX backend wheel: MLX_BACKEND=cpu|cuda on Linux (default cpu), metal on macOS. The oracle
// venv and the shim always use the same wheel, pinned in requirements/<backend>.txt.
const BACKENDS = isMac ? ["metal"] : ["cpu", "cuda"];
function backendChoice() {
  const want = process.env.MLX_BACKEND || (isMac ? "metal" : "cpu");
  if (!BACKENDS.includes(want)) {
    fail(`MLX_BACKEND=${want} is not a backend for ${process.platform}.`,
      isMac ? "On macOS the backend is metal (mlx-metal, whose CPU device is there too): unset MLX_BACKEND." : "On Linux use MLX_BACKEND=cpu (the default) or MLX_BACKEND=cuda (an NVIDIA GPU with a CUDA 13 driver).");
  }
  if (want === "cuda") {
    if (process.arch !== "x64" && process.arch !== "arm64") fail(`MLX_BACKEND=cuda: mlx-cuda-13 has no wheel for ${process.arch}.`, "Use MLX_BACKEND=cpu.");
    if (!existsSync("/proc/driver/nvidia/version") && !which("nvidia-smi")) {
      fail("MLX_BACKEND=cuda, but this machine has no NVIDIA GPU driver (no /proc/driver/nvidia/version, no nvidia-smi).",
        "mlx-cuda-13 needs an NVIDIA GPU with a CUDA 13 driver. Unset MLX_BACKEND (or set MLX_BACKEND=cpu) to use MLX's CPU backend.");
    }
  }
  return want;
}

// 2. Python venv with the pinned oracle packages (requirements.txt + requirements/<backend>.txt decide).
function findPython() {
  for (const cand of [process.env.PYTHON, "python3", "python"]) {
    if (!cand) continue;
    const r = spawnSync(cand, ["-c", "import sys; print(sys.version_info[0], sys.version_info[1]); print(sys.executable)"], { encoding: "utf8" });
    if (r.status !== 0) continue;
    const [ver, exe] = r.stdout.trim().split("\n");
    const [maj, min] = ver.split(" ").map(Number);
    if (maj === 3 && min >= 10) return exe;
  }
  return null;
}

function venv(backend) {
  const dir = join(root, ".venv");
  const py = join(dir, "bin", "python");
  const stamp = join(dir, ".requirements.sha256");
  const reqs = join("requirements", `${backend}.txt`);
  const want = sha(readOr(join(root, "requirements.txt")), readOr(join(root, reqs)), process.platform, process.arch, backend);
  if (readOr(stamp) === want && existsSync(py)) return py;
  const base = findPython();
  if (!base) fail("Python 3.10+ was not found on PATH.", "Install Python 3.10 or newer (e.g. `apt-get install python3 python3-venv`), or set PYTHON=/path/to/python3.");
  if (!existsSync(py)) {
    log(`creating the oracle venv with ${base}`);
    rmSync(dir, { recursive: true, force: true });
    run(base, ["-m", "venv", dir], "could not create the Python venv", "Install the venv module (Debian: `apt-get install python3-venv`).");
  }
  // Backend wheels ship the same files (mlx/lib/libmlx.so, the headers): drop the others first.
  const others = ["mlx-cpu", "mlx-cuda-13", "mlx-metal"].filter((w) => !readOr(join(root, reqs)).includes(`${w}==`));
  spawnSync(py, ["-m", "pip", "uninstall", "--disable-pip-version-check", "-q", "-y", ...others], { cwd: root, stdio: "ignore" });
  log(`installing the pinned oracle packages for the ${backend} backend (pip install -r ${reqs})`);
  run(py, ["-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", reqs], "pip install of the pinned oracle packages failed",
    "Check access to PyPI; the pins need Linux x86_64/aarch64 (mlx-cpu, mlx-cuda-13) or macOS arm64 (mlx-metal) with Python 3.10+.");
  if (backend === "cuda") {
    const r = spawnSync(py, ["-I", "-c", "import mlx.core as mx, sys; sys.exit(0 if mx.cuda.is_available() else 3)"], { cwd: root, encoding: "utf8" });
    if (r.status !== 0) fail("mlx-cuda-13 is installed, but MLX finds no usable CUDA GPU here.", `Check the NVIDIA driver (CUDA 13) with nvidia-smi. ${(r.stderr ?? "").trim().split("\n").pop() ?? ""}`);
  }
  writeFileSync(stamp, want);
  return py;
}

// MLX_DEVICE=cpu|gpu (the device of a test or parity run, on both sides) must be one of those,
// checked before anything installs, and exist here, checked with the venv's MLX.
function checkDeviceName() {
  const want = process.env.MLX_DEVICE;
  if (want && want !== "cpu" && want !== "gpu") fail(`MLX_DEVICE=${want} is not a device.`, "Use MLX_DEVICE=cpu or MLX_DEVICE=gpu, or leave it unset for MLX's default device.");
}
function checkDevice(py) {
  const want = process.env.MLX_DEVICE;
  if (!want) return;
  const r = spawnSync(py, ["-I", "-c", "import mlx.core as mx, sys; sys.exit(0 if mx.is_available(mx.gpu) else 3)"], { cwd: root });
  if (want === "gpu" && r.status !== 0) {
    fail("MLX_DEVICE=gpu, but this libmlx has no GPU here (CPU backend only).", "On Linux with an NVIDIA GPU, run setup with MLX_BACKEND=cuda; on macOS the Metal backend provides the GPU. Unset MLX_DEVICE to use the default device.");
  }
}

// 3. The native shim, linked against the wheel's libmlx with an rpath.
function shim(py, backend) {
  const cxx = process.env.CXX ?? (which("g++") ? "g++" : which("clang++") ? "clang++" : null);
  if (!cxx) fail("no C++ compiler (g++ or clang++) on PATH.", "Install one (Debian: `apt-get install g++`; macOS: `xcode-select --install`). MLX's compile() also needs g++ at run time on Linux.");
  const mlxDir = execFileSync(py, ["-I", "-c", "import mlx, os; print(os.path.dirname(mlx.__path__[0]) + '/mlx')"], { encoding: "utf8" }).trim();
  const inc = join(mlxDir, "include");
  const libDir = join(mlxDir, "lib");
  if (!existsSync(join(inc, "mlx", "mlx.h"))) fail(`MLX headers not found under ${inc}.`, "The backend wheel (requirements/<backend>.txt) must be installed: delete .venv and rerun.");
  const src = join(root, "mlx", "native", "shim.cpp");
  const out = join(root, "mlx", "build", `libmlx_bun.${isMac ? "dylib" : "so"}`);
  const args = ["-std=c++20", "-O2", "-fPIC", "-shared", `-I${inc}`, src, "-o", `${out}.tmp`, `-L${libDir}`, "-lmlx", `-Wl,-rpath,${libDir}`];
  // The backend and the library's identity are part of the key: switching wheels rebuilds.
  const lib = join(libDir, `libmlx.${isMac ? "dylib" : "so"}`);
  const libId = existsSync(lib) ? `${statSync(lib).size}:${statSync(lib).mtimeMs}` : "";
  const want = sha(readOr(src), args.join(" "), cxx, backend, libId);
  const stamp = `${out}.sha256`;
  if (readOr(stamp) === want && existsSync(out)) return;
  log(`building the native shim with ${cxx}`);
  mkdirSync(dirname(out), { recursive: true });
  run(cxx, args, "building the native shim failed", "See the compiler output above; a C++20 compiler is required.");
  renameSync(`${out}.tmp`, out);
  writeFileSync(stamp, want);
}

// 4. A system Chromium for the HTML report test (playwright-core drives it; Playwright's own
// browser download is never used). Installed from Debian's packages where setup runs as root.
function chromium() {
  if (process.platform !== "linux" || process.env.CHROMIUM_PATH) return;
  if (existsSync("/usr/bin/chromium") || existsSync("/usr/bin/chromium-browser")) return;
  if (process.getuid?.() !== 0 || !which("apt-get")) {
    log("note: Chromium is not installed, so the HTML report test is skipped (Debian: `apt-get install chromium`).");
    return;
  }
  log("installing Debian's chromium for the HTML report test (apt-get install chromium)");
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  run("apt-get", ["update", "-qq"], "apt-get update failed", "Install Chromium by hand (`apt-get install chromium`) or set CHROMIUM_PATH.", { env });
  run("apt-get", ["install", "-y", "-qq", "chromium"], "apt-get install chromium failed", "Install Chromium by hand or set CHROMIUM_PATH.", { env });
}

// 5. The fixture checkpoints, built by mlx-lm itself (.cache/checkpoints; the builder skips
// checkpoints that are up to date, so a second run takes a fraction of a second).
function checkpoints(py) {
  if (!existsSync(join(root, ".cache", "checkpoints", "index.json"))) log("building the fixture checkpoints with mlx-lm (first run only, about a minute)");
  const r = spawnSync(py, [join(root, "oracle", "python", "make_checkpoints.py")], { cwd: root, encoding: "utf8" });
  if (r.status !== 0) {
    process.stderr.write(r.stdout + r.stderr);
    fail("building the fixture checkpoints failed", "See the output above (oracle/python/make_checkpoints.py).");
  }
  const built = (r.stdout.match(/: built/g) ?? []).length;
  if (built) log(`built ${built} fixture checkpoints with mlx-lm`);
}

// 6. The speculative-decoding fixtures (perturbed drafts, window-64 copies, gemma4_assistant MTP
// drafters built with mlx-vlm's classes) from the fixture checkpoints; skipped when up to date.
function speculativeFixtures(py) {
  const r = spawnSync(py, [join(root, "oracle", "python", "make_speculative_fixtures.py")], { cwd: root, encoding: "utf8" });
  if (r.status !== 0) {
    process.stderr.write(r.stdout + r.stderr);
    fail("building the speculative-decoding fixtures failed", "See the output above (oracle/python/make_speculative_fixtures.py).");
  }
  const built = (r.stdout.match(/: built/g) ?? []).length;
  if (built) log(`built ${built} speculative-decoding fixtures`);
}

// bad MLX_BACKEND / MLX_DEVICE values: one message before any step installs anything
const backend = backendChoice();
checkDeviceName();
npmDeps();
const py = venv(backend);
checkDevice(py);
shim(py, backend);
chromium();
checkpoints(py);
speculativeFixtures(py);
if (!which("g++") && !isMac) log("warning: g++ is not on PATH, so MLX compile() is a no-op in both Python and TS.");
