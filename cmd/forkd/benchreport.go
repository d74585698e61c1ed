package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/sandbox"
)

// benchReport is the result of one `forkd bench` run. It prints as a
// Markdown section to append to docs/BENCHMARKS.md, or with --json as one
// JSON object carrying the same rows with their numbers.
type benchReport struct {
	Bench   string       `json:"bench"`
	Date    time.Time    `json:"date"`
	Machine benchMachine `json:"machine"`
	// Setup completes the Markdown "Machine:" line (snapshot, pool, ...).
	Setup string `json:"setup,omitempty"`
	// Intro is a paragraph between that line and the table.
	Intro string     `json:"intro,omitempty"`
	Rows  []benchRow `json:"rows"`
	// Failures are the first errors of requests that failed (bench api).
	Failures []string `json:"failures,omitempty"`
	// columns, when set, replace the "measure | value" table: each row
	// then has cells.
	columns []string
}

// benchMachine is the host and VMM a report was measured on.
type benchMachine struct {
	Host       string `json:"host"`
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	VMM        string `json:"vmm"`
	VMMVersion string `json:"vmm_version"`
	Accel      string `json:"accel,omitempty"`
}

// benchRow is one measure. Value is the text of the Markdown table; Values
// holds the numbers behind it, keyed by name and unit (p50_ms, wall_s,
// pss_mb, bytes, ratio).
type benchRow struct {
	Measure string             `json:"measure"`
	Value   string             `json:"value"`
	Values  map[string]float64 `json:"values,omitempty"`
	// Error says why the measure could not be taken on this host.
	Error string   `json:"error,omitempty"`
	cells []string // Markdown cells when the report has columns
}

// vals are a row's numbers.
type vals map[string]float64

func newBenchReport(ctx context.Context, e *sandbox.Engine, bench, accel string) *benchReport {
	host, _ := os.Hostname()
	v, _ := e.Driver().Version(ctx)
	return &benchReport{
		Bench: bench,
		Date:  time.Now().UTC(),
		Machine: benchMachine{Host: host, CPUs: runtime.NumCPU(), CPUModel: cpuModel(), Kernel: kernelRelease(),
			VMM: e.Driver().Name(), VMMVersion: v, Accel: accel},
	}
}

// row adds a measure: value is formatted as the Markdown shows it, v are
// the numbers for --json.
func (r *benchReport) row(measure, value string, v vals) {
	r.Rows = append(r.Rows, benchRow{Measure: measure, Value: value, Values: v})
}

// print writes the report to stdout: Markdown, or JSON with --json.
func (r *benchReport) print(asJSON bool) error { return r.write(os.Stdout, asJSON) }

func (r *benchReport) write(w io.Writer, asJSON bool) error {
	if !asJSON {
		_, err := io.WriteString(w, r.markdown())
		return err
	}
	// JSON has no NaN or infinity, and one such number (a ratio over an
	// empty measure: --sequential 0, a load where every request failed)
	// would make the whole report fail to encode at the end of the run.
	// The number is left out; the row's text still says it.
	for _, row := range r.Rows {
		for k, v := range row.Values {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				delete(row.Values, k)
			}
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *benchReport) markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "### forkd bench %s — %s\n\n", r.Bench, r.Date.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %s, %d CPUs (%s), kernel %s; VMM %s %s", m.Host, m.CPUs, m.CPUModel, m.Kernel, m.VMM, m.VMMVersion)
	if m.Accel != "" {
		fmt.Fprintf(&b, ", accel %s", m.Accel)
	}
	if r.Setup != "" {
		fmt.Fprintf(&b, "; %s", r.Setup)
	}
	b.WriteString(".\n\n")
	if r.Intro != "" {
		b.WriteString(r.Intro + "\n\n")
	}
	cols := r.columns
	if cols == nil {
		cols = []string{"measure", "value"}
	}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, row := range r.Rows {
		cells := row.cells
		if cells == nil {
			cells = []string{row.Measure, row.Value}
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
	}
	if len(r.Failures) > 0 {
		b.WriteString("\nFirst failures:\n\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	return b.String()
}

// millis is a duration in milliseconds, as the reports give them.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
