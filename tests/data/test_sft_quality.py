"""Transport failures are dropped, genuine API answers (errors included) are kept, and StableToolBench's
false positives (digits or words inside a real payload) are not repeated."""

import json
from pathlib import Path

import pytest

from mirrorapi.transport_failures import api_failed, in_band_error, transport_failure

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


@pytest.mark.parametrize(
    "error, kind",
    [
        ("Rate limit per minute error...", "rate_limit"),
        ("Too many requests error...", "rate_limit"),
        ("API not working error...", "unavailable"),
        ("Unauthorized error...", "auth"),
        ("Unsubscribed error...", "auth"),
        ("Gateway error...", "gateway"),
        ("request invalid, data error. status_code=500", "server_error"),
        ("Failed to generate fake response", "simulator_failure"),
        (
            "Function executing from my_tools.Logistics.pridnestrovie_post.api import get_track_info error...\n"
            "Exceeded 30 redirects.",
            "unavailable",
        ),
    ],
)
def test_transport_error_strings(error, kind):
    assert transport_failure(error, "") == kind


@pytest.mark.parametrize(
    "response, kind",
    [
        ('{"message":"You are not subscribed to this API."}', "auth"),
        ("{'message': 'This endpoint is disabled for your subscription'}", "auth"),
        ('{"status":"401","msg":"Authentication required"}', "auth"),
        ('{"status": 429, "message": "slow down"}', "rate_limit"),
        ('{"error": {"code": 503, "message": "backend down"}}', "server_error"),
        ("<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>", "gateway"),
        ("Internal Server Error", "server_error"),
        ("{'message': \"Endpoint '/search/shows' does not exist\"}", "unavailable"),
        ("The request timed out", "timeout"),
        # RapidAPI's own texts, as StableToolBench's executor (`process_error`) tells them apart: "API not working
        # error...", "Gateway error...", "Rate limit error..."
        (
            "{'messages': 'The API is unreachable, please contact the API provider', "
            "'info': 'Your Client (working) ---> Gateway (working) ---> API (not working)'}",
            "unavailable",
        ),
        ("Oops, an error in the gateway has occurred.", "gateway"),
        ("Access restricted. Check credits balance or enter the correct API key.", "rate_limit"),
        ("{'type': 'about:blank', 'title': 'Forbidden', 'status': 403}", "auth"),  # RFC 9457 problem details
        # StableToolBench's client writes a non-200 as "request invalid, data error. status_code=<n>", and its
        # check_result rejects a response holding `status_code=429` or `status_code=50...` (notes/stabletoolbench.md
        # §1, §3); 429 is Too Many Requests (RFC 6585 §4): a rate limit, 5xx the server's own failure (RFC 9110 §15.6).
        ("request invalid, data error. status_code=429", "rate_limit"),
        ("request invalid, data error. status_code=503", "server_error"),
    ],
)
def test_transport_failures_in_the_message(response, kind):
    assert transport_failure("", response) == kind


@pytest.mark.parametrize(
    "error, response",
    [
        ("", "500.0"),  # a calculator's answer
        ("", "{'price': 500, 'id': 404123, 'year': 1500, 'code': 401}"),
        ("", '{"code": 503, "city": "Lyon", "population": 516092}'),  # a field called code is not a status
        ("", "The parameter `blocked` is required for 500 items; see page 404."),
        ("", "the mascot leads the cheers during a timeout ."),  # a real API-Bank ImageCaption answer
        ("", "Forbidden City is the former imperial palace in Beijing."),
        ("", "The token is invalid."),
        ("", json.dumps({"articles": [{"title": "Rate limits explained", "body": "x" * 400}]})),
        ("The scene does not exist.", ""),  # API-Bank's own error: a genuine error example
        ("invalid parameter name. parameter: lang", ""),
        (
            "Function executing from my_tools.Movies.streaming_availability.api import search_basic_free error...\n"
            "search_basic_free() got an unexpected keyword argument 'query'",
            "",
        ),
        ("Message error...", "{'statusCode': 400, 'error': 'Bad Request', 'message': 'Invalid request query input'}"),
        ("", "{'title': 'Forbidden', 'year': 1997, 'type': 'movie'}"),  # a film, not a refusal
    ],
)
def test_genuine_answers_are_kept(error, response):
    assert transport_failure(error, response) is None


def test_every_real_sample_pair_classified_as_stabletoolbench_would_miss():
    # StableToolBench's substring rules drop every valid payload containing e.g. "500" or "parameter";
    # on the real sample, count how many of those we keep, and check that none of them is an error page.
    legacy_words = ("500", "404", "401", "403", "504", "parameter", "blocked", "does not exist", "parse")
    kept_by_us = []
    for line in open(SAMPLES / "pairs.jsonl", encoding="utf-8"):
        pair = json.loads(line)
        text = str(pair["response"]["response"]).lower()
        if any(w in text for w in legacy_words) and transport_failure(**pair["response"]) is None:
            kept_by_us.append(text)
    assert len(kept_by_us) >= 10
    assert not any(t.startswith("<html") for t in kept_by_us)


@pytest.mark.shared
def test_on_the_shared_pairs_only_live_rapidapi_calls_have_transport_failures(shared_data):
    # API-Bank and tau-bench pairs come from executing their implementations offline: none of them can
    # be a transport failure. ToolBench's recorded RapidAPI calls have a few (auth, removed endpoints).
    flagged = {}
    for path in sorted((shared_data / "pairs").glob("*.jsonl")):
        for line in open(path, encoding="utf-8"):
            pair = json.loads(line)
            kind = transport_failure(**pair["response"])
            if kind:
                flagged.setdefault(pair["source"], []).append(kind)
    assert set(flagged) == {"toolbench-example"}
    assert set(flagged["toolbench-example"]) == {"auth", "unavailable"} and len(flagged["toolbench-example"]) < 30


@pytest.mark.parametrize(
    "response, expected",
    [
        ("Error: flight HAT030 not available on date 2024-05-13", True),  # tau-bench's in-band error
        ('{"error": "user not found"}', True),
        ('{"status": "error", "detail": "x"}', True),
        ('{"success": false}', True),
        ('{"error": "", "data": [1, 2]}', False),
        ('{"status": "success"}', False),
        ("Errors are rare in this text", False),
        # RFC 9457 problem details (its §3: `status` is the HTTP status code), as a real ToolBench call recorded one
        (
            "{'type': 'https://tools.ietf.org/html/rfc7231#section-6.5.1', 'title': 'Bad Request', 'status': 400, "
            "'traceId': '|b1da6c94-47a57f57d8b1a7d2.'}",
            True,
        ),
        ('{"statusCode": 404, "message": "Not Found"}', True),
        ('{"status": 200, "message": "OK", "data": [1]}', False),
        ('{"code": 404, "city": "Lyon", "population": 516092}', False),  # a payload's field called code
        # JSend (github.com/omniti-labs/jsend), the envelope many JSON APIs answer in: "fail" for a call whose data
        # was refused, "error" for the server's failure, "success" for neither
        ('{"status": "fail", "data": {"title": "A title is required"}}', True),
        ('{"status": "error", "message": "Unable to communicate with database"}', True),
        ('{"status": "success", "data": {"post": {"id": 1}}}', False),
    ],
)
def test_in_band_errors(response, expected):
    assert in_band_error(response) is expected


def test_toolbench_message_error_is_what_its_response_says(samples):
    """ToolBench's executor sets the error "Message error..." whenever the text "error" is anywhere in the response
    (StableToolBench's `process_error`: `elif "error" in str(response)`), its observations then cut for the agent.
    Real recorded calls of the sample: a news page whose HTML holds an element id `af-error-container`, and film
    searches whose results hold the word past the recorded cut, are answers; a CEP lookup's 400 envelope and a
    `statusCode` 400 are failures."""
    pairs = [json.loads(line) for line in (samples / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    flagged = {}
    for pair in pairs:
        if pair["response"]["error"] == "Message error...":
            flagged.setdefault(pair["api_name"], set()).add(api_failed(**pair["response"]))
    assert flagged == {
        "news": {False},
        "search_basic_free": {False},
        "retorna_dados_do_endere_o_atrav_s_do_cep": {True},
        "raiderio_call": {True},
    }
    assert api_failed("The scene does not exist.", "") and api_failed("", "Error: no such user")
    assert not api_failed("", "{'result': [{'title': 'Error'}]}")
