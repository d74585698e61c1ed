package bench

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

// report is the result of one `forkd bench` run. It prints as a Markdown
// section to append to docs/BENCHMARKS.md, or with --json as one JSON
// object carrying the same rows with their numbers.
type report struct {
	Bench   string    `json:"bench"`
	Date    time.Time `json:"date"`
	Machine machine   `json:"machine"`
	// Setup completes the Markdown "Machine:" line (snapshot, pool, ...).
	Setup string `json:"setup,omitempty"`
	// Intro is a paragraph between that line and the table.
	Intro string      `json:"intro,omitempty"`
	Rows  []reportRow `json:"rows"`
	// Failures are the first errors of requests that failed (bench api).
	Failures []string `json:"failures,omitempty"`
	// columns, when set, replace the "measure | value" table: each row
	// then has cells.
	columns []string
}

// machine is the host and VMM a report was measured on.
type machine struct {
	Host       string `json:"host"`
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	VMM        string `json:"vmm"`
	VMMVersion string `json:"vmm_version"`
	Accel      string `json:"accel,omitempty"`
}

// reportRow is one measure. Value is the text of the Markdown table;
// Values holds the numbers behind it, keyed by name and unit (p50_ms,
// wall_s, pss_mb, bytes, ratio).
type reportRow struct {
	Measure string             `json:"measure"`
	Value   string             `json:"value"`
	Values  map[string]float64 `json:"values,omitempty"`
	// Error says why the measure could not be taken on this host.
	Error string   `json:"error,omitempty"`
	cells []string // Markdown cells when the report has columns
}

// vals are a row's numbers.
type vals map[string]float64

// newReport starts the report of bench on engine e's driver.
func newReport(ctx context.Context, e *sandbox.Engine, bench, accel string) *report {
	m := hostMachine()
	v, _ := e.Driver().Version(ctx)
	m.VMM, m.VMMVersion, m.Accel = e.Driver().Name(), v, accel
	return &report{Bench: bench, Date: time.Now().UTC(), Machine: m}
}

// hostMachine describes this host for a report with no VMM.
func hostMachine() machine {
	host, _ := os.Hostname()
	return machine{Host: host, CPUs: runtime.NumCPU(), CPUModel: cpuModel(), Kernel: kernelRelease(), VMM: "none", VMMVersion: "(no VM runs)"}
}

// row adds a measure: value is formatted as the Markdown shows it, v are
// the numbers for --json.
func (r *report) row(measure, value string, v vals) {
	r.Rows = append(r.Rows, reportRow{Measure: measure, Value: value, Values: v})
}

// write writes the report to w: Markdown, or JSON when asJSON.
func (r *report) write(w io.Writer, asJSON bool) error {
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

func (r *report) markdown() string {
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

// oneLine makes s fit a Markdown table cell of at most about n bytes.
func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

func kernelRelease() string {
	data, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(data))
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
