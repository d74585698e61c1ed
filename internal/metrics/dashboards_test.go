package metrics

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
)

// The monitoring files shipped in packaging/monitoring: a Prometheus scrape
// example, alert rules and a Grafana dashboard. These tests hold them to
// the daemon: every metric and label they name exists in the registry the
// daemon builds (New), observed or not, and the files are well-formed.

const monitoringDir = "../../packaging/monitoring"

// family is what the daemon can export under one name.
type family struct {
	histogram bool
	labels    map[string]bool // variable and constant label names
}

var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]*)"`)
	descLabels = regexp.MustCompile(`, constLabels: \{(.*)\}, variableLabels: \{([^}]*)\}\}$`)
	constLabel = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="`)
)

// families lists every metric family m's collectors describe (whether it
// has a series yet or not) plus those a gather returns (collectors that
// describe nothing up front).
func families(t *testing.T, m *Metrics) map[string]family {
	t.Helper()
	out := map[string]family{}
	for _, c := range m.collectors {
		_, hist := c.(*prometheus.HistogramVec)
		if _, ok := c.(prometheus.Histogram); ok {
			hist = true
		}
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			s := d.String()
			n := descName.FindStringSubmatch(s)
			l := descLabels.FindStringSubmatch(s)
			if n == nil || l == nil {
				t.Fatalf("cannot read the name and labels of %s", s)
			}
			labels := map[string]bool{}
			for _, cl := range constLabel.FindAllStringSubmatch(l[1], -1) {
				labels[cl[1]] = true
			}
			for _, vl := range strings.Split(l[2], ",") {
				if vl != "" {
					labels[strings.TrimSuffix(strings.TrimPrefix(vl, "c("), ")")] = true
				}
			}
			out[n[1]] = family{histogram: hist, labels: labels}
		}
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, ok := out[mf.GetName()]; !ok {
			f := family{histogram: mf.GetType().String() == "HISTOGRAM", labels: map[string]bool{}}
			for _, mt := range mf.GetMetric() {
				for _, lp := range mt.GetLabel() {
					f.labels[lp.GetName()] = true
				}
			}
			out[mf.GetName()] = f
		}
	}
	return out
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promName     = regexp.MustCompile(`\b(?:forkd|process|go)_[A-Za-z0-9_:]*`)
	promMatcher  = regexp.MustCompile(`^\s*(?:=~|!~|!=|=)`)
	promSelector = regexp.MustCompile(`\b((?:forkd|process|go)_[A-Za-z0-9_:]*)\s*\{([^}]*)\}`)
	promLabel    = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// promqlMetrics returns the metric names of forkd, its process and the Go
// runtime that a PromQL expression reads, and the label names each
// selector matches on. Label names (in groupings and matchers) and string
// literals are not metric names.
func promqlMetrics(expr string) (names []string, matchers map[string][]string) {
	bare := promString.ReplaceAllString(expr, `""`)
	matchers = map[string][]string{}
	for _, sel := range promSelector.FindAllStringSubmatch(bare, -1) {
		for _, l := range promLabel.FindAllStringSubmatch(sel[2], -1) {
			matchers[sel[1]] = append(matchers[sel[1]], l[1])
		}
	}
	bare = promGrouping.ReplaceAllString(bare, "")
	for _, loc := range promName.FindAllStringIndex(bare, -1) {
		if promMatcher.MatchString(bare[loc[1]:]) {
			continue // a label name in a matcher (go_version="...")
		}
		names = append(names, bare[loc[0]:loc[1]])
	}
	return names, matchers
}

func TestPromQLMetricExtraction(t *testing.T) {
	names, matchers := promqlMetrics(`sum by (go_version, le) (rate(forkd_x_bucket{dir="forkd_not_a_metric", go_y!~"a}b"}[5m]))
		/ on (instance) process_z and forkd_w{job="forkd"}`)
	sort.Strings(names)
	if want := []string{"forkd_w", "forkd_x_bucket", "process_z"}; !slices.Equal(names, want) {
		t.Errorf("names = %q, want %q", names, want)
	}
	if got := matchers["forkd_x_bucket"]; !slices.Equal(got, []string{"dir", "go_y"}) {
		t.Errorf("matchers of forkd_x_bucket = %q", got)
	}
}

// checkExpr fails t for each metric or matched label expr uses that the
// daemon does not export.
func checkExpr(t *testing.T, fams map[string]family, where, expr string) {
	t.Helper()
	names, matchers := promqlMetrics(expr)
	if len(names) == 0 && strings.Contains(expr, "forkd_") {
		t.Errorf("%s: no metric found in %q", where, expr)
	}
	resolve := func(name string) (family, bool) {
		if f, ok := fams[name]; ok {
			return f, true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				if f, ok := fams[base]; ok && f.histogram {
					if suffix == "_bucket" {
						f.labels = mapWith(f.labels, "le")
					}
					return f, true
				}
			}
		}
		return family{}, false
	}
	for _, n := range names {
		if _, ok := resolve(n); !ok {
			t.Errorf("%s: metric %s does not exist in forkd's registry (internal/metrics)", where, n)
		}
	}
	for n, labels := range matchers {
		f, ok := resolve(n)
		if !ok {
			continue // reported above
		}
		for _, l := range labels {
			if !f.labels[l] && l != "job" && l != "instance" {
				t.Errorf("%s: %s has no label %q (it has %v)", where, n, l, keys(f.labels))
			}
		}
	}
}

func mapWith(m map[string]bool, k string) map[string]bool {
	out := map[string]bool{k: true}
	for l := range m {
		out[l] = true
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func readMonitoring(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoringDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         *string           `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

func TestAlertRules(t *testing.T) {
	fams := families(t, New("test"))
	var rules alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(readMonitoring(t, "forkd-alerts.yml"))))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("forkd-alerts.yml: %v", err)
	}
	seen := map[string]bool{}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "forkd-alerts.yml: " + r.Alert + r.Record
			if r.Alert == "" {
				t.Errorf("%s: a rule without an alert name (recording rules belong elsewhere)", where)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert defined twice", where)
			}
			seen[r.Alert] = true
			alerts = append(alerts, r.Alert)
			if r.For == nil || !promDuration.MatchString(*r.For) {
				t.Errorf("%s: want an explicit for: duration (0m to fire at once), have %v", where, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity label %q, want critical, warning or info", where, s)
			}
			for _, a := range []string{"summary", "description"} {
				if len(strings.TrimSpace(r.Annotations[a])) < 20 {
					t.Errorf("%s: annotation %s is missing or too short to say what to do: %q", where, a, r.Annotations[a])
				}
			}
			checkExpr(t, fams, where, r.Expr)
		}
	}
	// What the issue asks the rules to cover.
	for _, want := range []string{"ForkdDown", "ForkdForkFailures", "ForkdAuditWriteFailures", "ForkdDiskNearlyFull", "ForkdPoolEmpty"} {
		if !seen[want] {
			t.Errorf("forkd-alerts.yml lacks alert %s (has %v)", want, alerts)
		}
	}
}

func TestScrapeExample(t *testing.T) {
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName         string `yaml:"job_name"`
			MetricsPath     string `yaml:"metrics_path"`
			Scheme          string `yaml:"scheme"`
			BearerTokenFile string `yaml:"bearer_token_file"`
			Authorization   struct {
				Type            string `yaml:"type"`
				CredentialsFile string `yaml:"credentials_file"`
			} `yaml:"authorization"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(readMonitoring(t, "prometheus.yml"), &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	for _, f := range cfg.RuleFiles {
		if _, err := os.Stat(filepath.Join(monitoringDir, f)); err != nil {
			t.Errorf("prometheus.yml: rule file %s is not shipped beside it: %v", f, err)
		}
	}
	found := false
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "forkd" {
			continue
		}
		found = true
		// /metrics is admin-only on the TCP listener (api/authorize.go).
		if sc.MetricsPath != "/metrics" {
			t.Errorf("prometheus.yml: metrics_path %q, the daemon serves /metrics", sc.MetricsPath)
		}
		if !strings.EqualFold(sc.Authorization.Type, "Bearer") || sc.Authorization.CredentialsFile == "" {
			t.Errorf("prometheus.yml: the forkd job sends no bearer token from a file: %+v", sc.Authorization)
		}
		if sc.BearerTokenFile != "" {
			t.Errorf("prometheus.yml: bearer_token_file and authorization together are refused by Prometheus")
		}
	}
	if !found {
		t.Error(`prometheus.yml: no job_name "forkd" (the alert rules and the dashboard select job="forkd")`)
	}
}

// grafanaDashboard is what the test reads of the dashboard.
type grafanaDashboard struct {
	UID        string         `json:"uid"`
	Title      string         `json:"title"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

func TestGrafanaDashboard(t *testing.T) {
	fams := families(t, New("test"))
	var d grafanaDashboard
	dec := json.NewDecoder(strings.NewReader(string(readMonitoring(t, "grafana-dashboard.json"))))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("grafana-dashboard.json: uid %q, title %q: both are needed to import it", d.UID, d.Title)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "datasource" && v.Query != "prometheus" {
			t.Errorf("grafana-dashboard.json: data source variable %s lists %v, want prometheus", v.Name, v.Query)
		}
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				checkExpr(t, fams, "grafana-dashboard.json: variable "+v.Name, s)
			}
		}
	}
	if !vars["datasource"] {
		t.Fatal("grafana-dashboard.json: no datasource variable: the dashboard would be bound to one Grafana's data source")
	}
	ids := map[int]bool{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			where := "grafana-dashboard.json: panel " + p.Title
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("%s: id %d is zero or not unique", where, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
				t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: data source %+v, want the ${datasource} variable", where, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no queries", where)
			}
			for _, tg := range p.Targets {
				checkExpr(t, fams, where, tg.Expr)
				for _, v := range grafanaVar.FindAllStringSubmatch(tg.Expr, -1) {
					if !vars[v[1]] && !strings.HasPrefix(v[1], "__") {
						t.Errorf("%s: uses $%s, which the dashboard does not define", where, v[1])
					}
				}
			}
		}
	}
	walk(d.Panels)
	if len(ids) < 10 {
		t.Errorf("grafana-dashboard.json: %d panels", len(ids))
	}
}

// TestMonitoringWithPromtool runs Prometheus's own checks when promtool is
// installed (Debian: package prometheus; or FORKD_PROMTOOL=path): the rule
// file and the scrape example parse as Prometheus parses them, and the
// alert rules' unit tests (testdata/forkd-alerts-test.yml) pass. Without promtool
// it skips; the tests above still hold the files to the daemon.
func TestMonitoringWithPromtool(t *testing.T) {
	promtool := os.Getenv("FORKD_PROMTOOL")
	if promtool == "" {
		var err error
		if promtool, err = exec.LookPath("promtool"); err != nil {
			t.Skip("promtool not installed (apt-get install prometheus, or FORKD_PROMTOOL=PATH)")
		}
	}
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(monitoringDir, "check", "rules", "forkd-alerts.yml")
	// The unit tests run against the rules without their annotations,
	// which promtool would compare too (TestAlertRules checks them).
	var rules map[string]any
	if err := yaml.Unmarshal(readMonitoring(t, "forkd-alerts.yml"), &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			delete(r.(map[string]any), "annotations")
		}
	}
	bare, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	unit := t.TempDir()
	ruleTests, err := os.ReadFile("testdata/forkd-alerts-test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"forkd-alerts.yml": bare, "forkd-alerts-test.yml": ruleTests} {
		if err := os.WriteFile(filepath.Join(unit, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run(unit, "test", "rules", "forkd-alerts-test.yml")
	// check config opens the files the example names: give it a copy
	// whose /etc/prometheus files exist.
	dir := t.TempDir()
	cfg := strings.ReplaceAll(string(readMonitoring(t, "prometheus.yml")), "/etc/prometheus/", dir+"/")
	for name, data := range map[string][]byte{
		"prometheus.yml":   []byte(cfg),
		"forkd-alerts.yml": readMonitoring(t, "forkd-alerts.yml"),
		"forkd.token":      []byte("fkd_example\n"),
		"forkd-ca.pem":     nil,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run(dir, "check", "config", "prometheus.yml")
}
