package telemetry

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// ckpt_wal_lag_seconds is the age of the newest through time shipped,
// measured when scraped: it grows while nothing is shipped, drops with a
// round, and goes away when the task stops shipping. The counters count
// bytes, segments and gaps.
func TestWALLagIsTheAgeOfTheNewestShippedStateWhenScraped(t *testing.T) {
	tel, err := New(context.Background(), Options{Job: "orders", Storage: "file:///x", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx := context.Background()
	lag := func() (float64, bool) {
		t.Helper()
		_, body := get(t, tel.Handler(ServerOptions{}), "/metrics")
		m := regexp.MustCompile(`(?m)^ckpt_wal_lag_seconds\{ckpt_job="orders",task="orders-3"\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	if _, ok := lag(); ok {
		t.Fatal("a lag before the task ships")
	}
	tel.WALRebased("orders-3", 7, time.Now().Add(-30*time.Second))
	if v, ok := lag(); !ok || v < 30 || v > 40 {
		t.Fatalf("lag after the rebase on a checkpoint of 30s ago: %v %v", v, ok)
	}
	tel.WALShipped(ctx, "orders-3", 1, time.Now().Add(-2*time.Second), 4096, 2)
	if v, ok := lag(); !ok || v < 2 || v > 10 {
		t.Fatalf("lag after a round through 2s ago: %v", v)
	}
	time.Sleep(1100 * time.Millisecond)
	if v, _ := lag(); v < 3 {
		t.Fatalf("lag %v did not grow while nothing was shipped", v)
	}
	tel.WALEnded(ctx, "orders-3", "gap", true)
	_, body := get(t, tel.Handler(ServerOptions{}), "/metrics")
	for _, want := range []string{
		`ckpt_wal_bytes_total{ckpt_job="orders",task="orders-3"} 4096`,
		`ckpt_wal_segments_total{ckpt_job="orders",task="orders-3"} 2`,
		`ckpt_wal_gaps_total{ckpt_job="orders",task="orders-3"} 1`,
	} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).MatchString(body) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	v := tel.View()
	if len(v.Tasks) != 1 || v.Tasks[0].WAL == nil || v.Tasks[0].WAL.Seq != 1 || v.Tasks[0].WAL.Gaps != 1 || v.Tasks[0].WAL.Ended == "" {
		t.Fatalf("view: %+v", v.Tasks)
	}
	tel.WALStopped("orders-3")
	if _, ok := lag(); ok {
		t.Fatal("a lag after the task stopped shipping")
	}
}
