"""The shared model function behind LitServe's batching (a peer for the bench).

Run: ``python benchmarks/peers/litserve_peer.py --port P --max-batch-size 8 --timeout 0.05
--model M``; serves ``POST /predict`` until killed.
"""

import sys
from pathlib import Path
from typing import Any

import litserve as ls

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_render, peer_args, png_b64


class RenderAPI(ls.LitAPI):  # type: ignore[misc]
    """Module-level so LitServe can hand it to its worker process."""

    def __init__(self, model: str, steps: int | None, threads: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.model, self.steps, self.threads = model, steps, threads

    def setup(self, device: str) -> None:
        self.render = load_render(self.model, self.steps, self.threads)

    def decode_request(self, request: dict[str, Any]) -> tuple[str, int]:
        return (str(request["prompt"]), int(request["seed"]))

    def batch(self, inputs: list[tuple[str, int]]) -> list[tuple[str, int]]:
        return inputs

    def predict(self, x: Any) -> Any:
        items = x if isinstance(x, list) else [x]
        images = self.render([p for p, _ in items], [s for _, s in items])
        return images if isinstance(x, list) else images[0]

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output: Any) -> dict[str, str]:
        return {"b64_json": png_b64(output)}


def main() -> None:
    args = peer_args("--timeout")
    api = RenderAPI(
        args.model,
        args.steps,
        args.threads,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.timeout,
    )
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=600)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
