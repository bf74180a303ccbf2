// Loaded before every test file (bunfig.toml): MLX_DEVICE=cpu|gpu makes that device MLX's
// default in the test process, as oracle/python/device_env.py does in every oracle process.
import { applyDeviceEnv } from "@mlx-bun/mlx";

try {
  applyDeviceEnv();
} catch (e) {
  process.stderr.write(`error: ${(e as Error).message}\n`);
  process.exit(2);
}
