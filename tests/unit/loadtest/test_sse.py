"""SSE parsing: any split of the byte stream into reads yields the same events."""

from hypothesis import given
from hypothesis import strategies as st

from loadtest.sse import SSEEvent, SSEParser


def parse(reads):
    parser = SSEParser()
    events = []
    for read in reads:
        events.extend(parser.feed(read))
    return events


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(data[prev:p])
        prev = p
    pieces.append(data[prev:])
    return pieces


STREAM = (
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"text":"a"}]}\n\n'
    b'data: {"choices":[{"text":"b"}]}\n\ndata: {"choices":[{"text":"c"}]}\n\n'
    b"event: note\r\nid: 7\r\ndata: line1\r\ndata: line2\r\n\r\n"
    b"data:no-space\rdata:  two-spaces\r\r"
    b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n'
    b"retry: 100\nunknown: x\n\n"
    b"data: [DONE]\n\n"
)

EXPECTED = [
    SSEEvent(b'{"choices":[{"text":"a"}]}'),
    SSEEvent(b'{"choices":[{"text":"b"}]}'),
    SSEEvent(b'{"choices":[{"text":"c"}]}'),
    SSEEvent(b"line1\nline2", event="note", id="7"),
    SSEEvent(b"no-space\n two-spaces", id="7"),
    SSEEvent(b'{"error": {"message": "boom", "type": "server_error"}}', id="7"),
    SSEEvent(b"[DONE]", id="7"),
]


def test_whole_stream_parses_to_the_expected_events():
    assert parse([STREAM]) == EXPECTED


def test_byte_by_byte_reads_give_the_same_events():
    assert parse([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_any_split_of_the_stream_gives_the_same_events(cuts):
    assert parse(split_at(STREAM, cuts)) == EXPECTED


line_text = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=30
)
newline = st.sampled_from([b"\n", b"\r", b"\r\n"])


@st.composite
def event_streams(draw):
    """Random events, comments between them, and their expected data, in one line-ending style.

    One style per stream: a CR line end followed by an LF one would read as a single CRLF.
    """
    expected, out = [], b""
    eol = draw(newline)
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        if draw(st.booleans()):
            out += b":" + draw(line_text).encode() + eol
        lines = draw(st.lists(line_text, min_size=1, max_size=3))
        for line in lines:
            out += b"data: " + line.encode() + eol
        out += eol
        expected.append("\n".join(lines).encode())
    return out, expected


@given(event_streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_random_streams_parse_identically_under_any_split(stream, cuts):
    data, expected = stream
    whole = parse([data])
    assert [e.data for e in whole] == expected
    assert parse(split_at(data, cuts)) == whole


def test_an_event_cut_off_by_the_end_of_the_stream_is_pending_not_emitted():
    parser = SSEParser()
    assert parser.feed(b'data: {"choices": []}\n') == []
    assert parser.pending


def test_a_blank_line_without_data_dispatches_nothing():
    assert parse([b"\n\n\nevent: x\n\n"]) == []
