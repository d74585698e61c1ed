package controller

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// histogramCount returns the sample count of a histogram in
// controller-runtime's registry, summed over the series whose label name
// has value (every series when name is empty).
func histogramCount(t *testing.T, metric, name, value string) uint64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			if name == "" || labelIs(m, name, value) {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

func TestPlacementAndStartOverheadAreObserved(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: gib, snapshots: map[string]int{"py": 512}})
	holder := histogramCount(t, MetricPlacementSeconds, "result", placeHolder)
	full := histogramCount(t, MetricPlacementSeconds, "result", placeNoCapacity)
	started := histogramCount(t, MetricStartOverheadSeconds, "pull", "false")
	startedAll := histogramCount(t, MetricStartOverheadSeconds, "", "")

	e.create(newSandbox("m1", "py"))
	e.reconcile("m1")
	e.create(newSandbox("m2", "py"))
	e.reconcile("m2")
	e.create(newSandbox("m3", "py")) // 1 GiB holds two of 512 MiB
	e.reconcile("m3")

	if got := histogramCount(t, MetricPlacementSeconds, "result", placeHolder) - holder; got != 2 {
		t.Errorf("%s{result=holder} grew by %d, want 2", MetricPlacementSeconds, got)
	}
	if got := histogramCount(t, MetricPlacementSeconds, "result", placeNoCapacity) - full; got != 1 {
		t.Errorf("%s{result=no_capacity} grew by %d, want 1", MetricPlacementSeconds, got)
	}
	if got := histogramCount(t, MetricStartOverheadSeconds, "pull", "false") - started; got != 2 {
		t.Errorf("%s{pull=false} grew by %d, want 2 (the two sandboxes that run)", MetricStartOverheadSeconds, got)
	}
	// Reconciling a running sandbox again observes nothing more.
	e.reconcile("m1")
	if got := histogramCount(t, MetricStartOverheadSeconds, "", "") - startedAll; got != 2 {
		t.Errorf("%s grew by %d after a resync, want still 2", MetricStartOverheadSeconds, got)
	}
}
