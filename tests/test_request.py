"""The two records that cross every border: a request's JSON line and the digest of what a replay sends."""
from __future__ import annotations

import json

from optladder.traffic.request import Request, RequestRecord, requests_digest


def test_a_record_is_one_compact_json_line_that_reads_back_the_same():
    rec = RequestRecord("a", 0.5, 8, 4, sent_at=1.0, first_token_at=1.5, finished_at=2.0, output_tokens=4,
                        token_times=[1.5, 1.7], ok=True, output_text="hi, there: x")
    line = rec.to_json()
    assert "\n" not in line and ", " not in line.replace("hi, there", "") and '": ' not in line
    assert RequestRecord.from_dict(json.loads(line)) == rec


def test_the_digest_sees_what_is_sent_to_the_microsecond():
    base = [Request("a", [1, 2, 3], 4, scheduled_at=1.0)]
    same = requests_digest([Request("a", [1, 2, 3], 4, scheduled_at=1.0 + 4e-7)])
    assert requests_digest(base) == same  # float noise below a microsecond is not a different schedule
    for other in (Request("a", [1, 2, 3], 4, scheduled_at=1.00001), Request("b", [1, 2, 3], 4, scheduled_at=1.0),
                  Request("a", [1, 2, 4], 4, scheduled_at=1.0), Request("a", [1, 2, 3], 5, scheduled_at=1.0),
                  Request("a", [1, 2, 3], 4, scheduled_at=1.0, ignore_eos=False)):
        assert requests_digest([other]) != requests_digest(base), other
