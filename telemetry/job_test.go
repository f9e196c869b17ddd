package telemetry

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTheJobViewIsScannedOnlyWhileThePageIsViewedAndAtMostOncePerInterval(t *testing.T) {
	tel, err := New(context.Background(), Options{Job: "orders", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	var scans atomic.Int64
	src := func(ctx context.Context) JobView {
		n := scans.Add(1)
		return JobView{Complete: uint64(n), Tasks: []JobTask{{Task: "orders-0", Newest: uint64(n), Node: "node-1", Epoch: 1}}}
	}
	page := func(w io.Writer, v View) error {
		if v.JobStatus == nil {
			_, err := fmt.Fprint(w, "job: none")
			return err
		}
		_, err := fmt.Fprintf(w, "job: complete %d", v.JobStatus.Complete)
		return err
	}
	h := tel.Handler(ServerOptions{Page: page})

	// Installed, but nobody looks: no scan.
	tel.SetJobSource(time.Hour, src)
	time.Sleep(20 * time.Millisecond)
	if n := scans.Load(); n != 0 || tel.View().JobStatus != nil {
		t.Fatalf("%d scans and view %+v before the page was served, want none", n, tel.View().JobStatus)
	}
	// The first view waits for the first scan.
	if _, body := get(t, h, "/"); body != "job: complete 1" {
		t.Fatalf("first page: %q, want the first scan's view", body)
	}
	// Within the interval, views reuse it.
	for range 5 {
		if _, body := get(t, h, "/"); body != "job: complete 1" {
			t.Fatalf("page within the interval: %q", body)
		}
	}
	if n := scans.Load(); n != 1 {
		t.Fatalf("%d scans for six views within the interval, want 1", n)
	}
	// A stale view is served as is while the next scan runs.
	tel.SetJobSource(time.Nanosecond, src)
	get(t, h, "/")
	deadline := time.Now().Add(5 * time.Second)
	for tel.View().JobStatus.Complete != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the stale view was not refreshed: %+v", tel.View().JobStatus)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// RefreshJob scans now; the view is a copy.
	tel.RefreshJob(context.Background())
	v := tel.View().JobStatus
	if v.Complete != 3 || v.ScannedAt.IsZero() {
		t.Fatalf("after RefreshJob: %+v", v)
	}
	v.Tasks[0].Node = "changed"
	if tel.View().JobStatus.Tasks[0].Node != "node-1" {
		t.Fatal("View shares the job view's tasks with its caller")
	}
	// Uninstalled: no view, no scan.
	tel.SetJobSource(0, nil)
	tel.RefreshJob(context.Background())
	if _, body := get(t, h, "/"); body != "job: none" || scans.Load() != 3 {
		t.Fatalf("after uninstalling: %q, %d scans", body, scans.Load())
	}
}

func TestTheJobViewIsNilSafe(t *testing.T) {
	var tel *Telemetry
	tel.SetJobSource(time.Second, func(context.Context) JobView { return JobView{} })
	tel.RefreshJob(context.Background())
	tel.refreshJobForPage(context.Background())
	if v := tel.View(); v.JobStatus != nil {
		t.Fatalf("a nil Telemetry's view has a job status: %+v", v.JobStatus)
	}
	if n := (&JobView{Tasks: []JobTask{{Behind: true}, {}, {Behind: true}}}).BehindCount(); n != 2 {
		t.Fatalf("BehindCount %d, want 2", n)
	}
}

func TestASlowJobScanDoesNotHoldThePageLong(t *testing.T) {
	tel, err := New(context.Background(), Options{Job: "orders", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	tel.SetJobSource(time.Hour, func(ctx context.Context) JobView {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return JobView{Error: "slow"}
	})
	h := tel.Handler(ServerOptions{Page: func(w io.Writer, v View) error {
		_, err := fmt.Fprintf(w, "scanned: %v", v.JobStatus != nil)
		return err
	}})
	start := time.Now()
	_, body := get(t, h, "/")
	if took := time.Since(start); took > jobFirstWait+2*time.Second || !strings.Contains(body, "scanned: false") {
		t.Fatalf("page with a hung scan: %q after %v", body, took)
	}
	close(release)
	tel.Shutdown(context.Background()) // waits for the scan to end
	if v := tel.View().JobStatus; v == nil || v.Error != "slow" {
		t.Fatalf("after the scan ended: %+v", v)
	}
}
