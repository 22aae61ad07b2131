"""Verifies one report delivery as a receiver would, with the Standard
Webhooks reference library (PyPI `standardwebhooks`).

    verify_webhook.py BODY_FILE HEADERS_JSON_FILE SECRET [CLOCK_SHIFT_SECONDS]

Prints `ok <batch_id>` when the delivery verifies, `refused: <why>` when the
library refuses it (exit 0 both ways: the test decides which it expected).
CLOCK_SHIFT_SECONDS moves the verifier's clock, so the test can check the
timestamp tolerance without waiting five minutes.
"""

import json
import sys
from datetime import datetime, timedelta

import standardwebhooks.webhooks as webhooks
from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> None:
    body_file, headers_file, secret = sys.argv[1:4]
    shift = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    if shift:
        real = webhooks.datetime

        class Shifted(real):  # type: ignore[misc, valid-type]
            @classmethod
            def now(cls, tz=None):
                return real.now(tz) + timedelta(seconds=shift)

        webhooks.datetime = Shifted
    with open(body_file, "rb") as f:
        body = f.read()
    with open(headers_file) as f:
        headers = json.load(f)
    try:
        report = Webhook(secret).verify(body, headers)
    except WebhookVerificationError as e:
        print(f"refused: {e}")
        return
    print(f"ok {report['batch_id']}")


if __name__ == "__main__":
    main()
