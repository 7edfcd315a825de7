"""The floor: a bare FastAPI endpoint on the same uvicorn, answering the same 8x8 PNG.

No batching, no queue, no auth, no thread hop: ``POST /predict`` parses the same JSON body
renderq takes and answers a blank 8x8 PNG, base64 in JSON, encoded per request as renderq
encodes each image. What renderq adds on the null model above this is its own overhead.

Run: ``python benchmarks/peers/fastapi_peer.py --port P --model null``; serves until killed.
"""

import json
import sys
from pathlib import Path

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import peer_args, png_b64


class Body(BaseModel):
    """The body renderq's generation endpoint reads, as far as the null model needs."""

    prompt: str
    seed: int = 0


def main() -> None:
    args = peer_args("--timeout")  # the timeout is accepted and means nothing here
    if args.model != "null":
        raise SystemExit("the bare FastAPI floor serves the null model only")

    import numpy as np
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI()
    blank = np.zeros((8, 8, 3), dtype=np.uint8)

    @app.post("/predict")
    async def predict(body: Body) -> Response:
        text = json.dumps({"b64_json": png_b64(blank), "seed": body.seed})
        return Response(text, media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
