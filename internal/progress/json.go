package progress

import (
	"encoding/json"
	"io"
	"math"
	"time"
)

// Event is one line of the JSON renderer's NDJSON output.
type Event struct {
	// Event is "step" (a step began), "bytes" (its byte count) or "done"
	// (the operation ended; Error says why it failed).
	Event string `json:"event"`
	// Op names the operation ("pack", "unpack", "cp", "image.build",
	// "snapshot.create").
	Op string `json:"op"`
	// Step is the current step's name (absent on "done").
	Step string    `json:"step,omitempty"`
	Time time.Time `json:"time"`
	// ElapsedMillis is the time since the operation began.
	ElapsedMillis int64 `json:"elapsed_ms"`
	// Bytes moved in the step so far ("bytes" events only).
	Bytes *int64 `json:"bytes,omitempty"`
	// Total bytes of the step, when known.
	Total *int64 `json:"total,omitempty"`
	// BytesPerSecond since the step's first byte, once measured.
	BytesPerSecond float64 `json:"bytes_per_second,omitempty"`
	// ETAMillis is the time left at that rate, when Total is known.
	ETAMillis *int64 `json:"eta_ms,omitempty"`
	// Final marks the step's last byte count.
	Final bool   `json:"final,omitempty"`
	Error string `json:"error,omitempty"`
}

// jsonEvery spaces "bytes" events: two a second is enough to follow a
// transfer and small enough to log.
const jsonEvery = 500 * time.Millisecond

// jsonRenderer writes an Event per line.
type jsonRenderer struct {
	enc *json.Encoder
}

func newJSONRenderer(out io.Writer) *jsonRenderer {
	return &jsonRenderer{enc: json.NewEncoder(out)}
}

func (j *jsonRenderer) every() time.Duration { return jsonEvery }

func (j *jsonRenderer) step(s State) { j.enc.Encode(eventOf("step", s)) }

func (j *jsonRenderer) bytes(s State) {
	ev := eventOf("bytes", s)
	n := s.Bytes
	ev.Bytes = &n
	if s.Total >= 0 {
		t := s.Total
		ev.Total = &t
	}
	ev.BytesPerSecond = math.Round(s.Rate)
	if eta, ok := s.ETA(); ok {
		ms := eta.Milliseconds()
		ev.ETAMillis = &ms
	}
	ev.Final = s.Final
	j.enc.Encode(ev)
}

func (j *jsonRenderer) end(s State, err error) {
	ev := eventOf("done", s)
	ev.Step = ""
	if err != nil {
		ev.Error = err.Error()
	}
	j.enc.Encode(ev)
}

func eventOf(kind string, s State) Event {
	return Event{Event: kind, Op: s.Op, Step: s.Step, Time: s.Now.UTC(), ElapsedMillis: s.Elapsed.Milliseconds()}
}
