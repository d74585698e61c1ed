package loadtest

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// This file holds what the load test measures with: the heap, percentiles,
// the controller's histograms and the apiserver's request counts.

func heapBytes() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))].Round(10 * time.Microsecond)
}

func pctF(f []float64, p float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// hist is a histogram from controller-runtime's registry, its series
// summed: cumulative counts by upper bound.
type hist struct {
	count  uint64
	bounds []float64
	cum    []uint64
}

func histogram(t *testing.T, name string) hist {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var h hist
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			h.add(m.GetHistogram())
		}
	}
	return h
}

func (h *hist) add(p *dto.Histogram) {
	h.count += p.GetSampleCount()
	for i, b := range p.GetBucket() {
		if i == len(h.bounds) {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.cum = append(h.cum, 0)
		}
		h.cum[i] += b.GetCumulativeCount()
	}
}

func (h hist) minus(o hist) hist {
	out := hist{count: h.count - o.count, bounds: h.bounds, cum: slices.Clone(h.cum)}
	for i := range out.cum {
		if i < len(o.cum) {
			out.cum[i] -= o.cum[i]
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding the q-quantile (the
// histogram says no more); past the last bucket it says so.
func (h hist) quantile(q float64) string {
	if h.count == 0 {
		return "n/a"
	}
	rank := uint64(float64(h.count)*q + 0.5)
	for i, c := range h.cum {
		if c >= max(rank, 1) {
			return time.Duration(h.bounds[i] * float64(time.Second)).String()
		}
	}
	return fmt.Sprintf("> %v", time.Duration(h.bounds[len(h.bounds)-1]*float64(time.Second)))
}

// requests counts the apiserver's requests (apiserver_request_total) on
// forkd.dev resources, by "VERB resource[/subresource][ code]" (the code
// when not 2xx: a 409 is a conflict, a write retried).
type requests map[string]float64

// apiserverRequests reads the apiserver's /metrics.
func apiserverRequests(t *testing.T, ctx context.Context, cfg *rest.Config) requests {
	t.Helper()
	rc, err := rest.RESTClientFor(restConfigForMetrics(cfg))
	if err != nil {
		t.Fatal(err)
	}
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("GET /metrics from the apiserver: %v", err)
	}
	out := requests{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `group="forkd.dev"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		key := label(line, "verb") + " " + label(line, "resource")
		if sub := label(line, "subresource"); sub != "" {
			key += "/" + sub
		}
		if code := label(line, "code"); !strings.HasPrefix(code, "2") {
			key += " " + code
		}
		out[key] += v
	}
	return out
}

func restConfigForMetrics(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return c
}

// label returns a label's value in a metric line.
func label(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

func (r requests) minus(o requests) requests {
	out := requests{}
	for k, v := range r {
		if d := v - o[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// per formats the counts divided by n, writes first.
func (r requests) per(n int) string {
	keys := slices.Sorted(maps.Keys(r))
	var writes, reads float64
	var parts []string
	for _, k := range keys {
		verb, _, _ := strings.Cut(k, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE":
			writes += r[k]
		case "WATCH":
			continue
		default:
			reads += r[k]
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", k, r[k]/float64(n)))
	}
	return fmt.Sprintf("%.2f writes, %.2f reads (%s)", writes/float64(n), reads/float64(n), strings.Join(parts, ", "))
}
