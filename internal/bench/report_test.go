package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	r := &report{Bench: "spawn", Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		Machine: machine{Host: "h", CPUs: 2, CPUModel: "cpu", Kernel: "6.1", VMM: "qemu", VMMVersion: "7.2", Accel: "tcg"},
		Setup:   "pool 2"}
	r.row("fork-to-ready (agent answering), p50 / p90", "1.0 ms / 2.0 ms", vals{"p50_ms": 1, "p90_ms": 2})
	md := r.markdown()
	want := "### forkd bench spawn — 2026-01-02 03:04 UTC\n\nMachine: h, 2 CPUs (cpu), kernel 6.1; VMM qemu 7.2, accel tcg; pool 2.\n\n" +
		"| measure | value |\n|---|---|\n| fork-to-ready (agent answering), p50 / p90 | 1.0 ms / 2.0 ms |\n"
	if md != want {
		t.Errorf("markdown:\n%s\nwant:\n%s", md, want)
	}
	var out bytes.Buffer
	if err := r.write(&out, false); err != nil || out.String() != want {
		t.Errorf("write (Markdown): %v\n%s", err, out.String())
	}
	r.columns = []string{"a", "b"}
	r.Rows = []reportRow{{Measure: "m", Error: "no", cells: []string{"1", "2"}}}
	r.Failures = []string{"client 1: refused"}
	if md := r.markdown(); !strings.Contains(md, "| a | b |\n|---|---|\n| 1 | 2 |\n") || !strings.HasSuffix(md, "\nFirst failures:\n\n- client 1: refused\n") {
		t.Errorf("markdown with columns and failures:\n%s", md)
	}
	data, _ := json.Marshal(r)
	var back map[string]any
	json.Unmarshal(data, &back)
	if back["bench"] != "spawn" || back["machine"].(map[string]any)["accel"] != "tcg" || back["rows"].([]any)[0].(map[string]any)["error"] != "no" {
		t.Errorf("json: %s", data)
	}
}

// A ratio over an empty measure is NaN or infinite; --json still prints
// the report (without that number) instead of failing after the run.
func TestReportJSONWithNonFiniteNumbers(t *testing.T) {
	r := &report{Bench: "spawn"}
	zero := 0.0
	r.row("cold boot / fork-to-ready p50", fmt.Sprintf("%.0f×", 1/zero), vals{"ratio": 1 / zero})
	r.row("head / flat", fmt.Sprintf("%.2f×", zero/zero), vals{"ratio": zero / zero, "n": 3})
	var buf bytes.Buffer
	if err := r.write(&buf, true); err != nil {
		t.Fatalf("--json: %v", err)
	}
	var back report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, buf.String())
	}
	if len(back.Rows) != 2 || len(back.Rows[0].Values) != 0 || back.Rows[1].Values["n"] != 3 || back.Rows[0].Value != "+Inf×" {
		t.Fatalf("rows %+v", back.Rows)
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("a|b\nc", 10); got != "a/b c" {
		t.Errorf("oneLine: %q", got)
	}
	if got := oneLine(strings.Repeat("x", 12), 10); got != strings.Repeat("x", 10)+"…" {
		t.Errorf("oneLine of a long text: %q", got)
	}
}
