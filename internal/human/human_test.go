package human

import (
	"testing"
	"time"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.00 KiB"}, {1536, "1.50 KiB"},
		{10*mib + 300*kib, "10.3 MiB"}, {999 * mib, "999 MiB"}, {1023 * mib, "1023 MiB"},
		{1 << 30, "1.00 GiB"}, {5 << 40, "5.00 TiB"},
	} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestDuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0 s"}, {850 * time.Microsecond, "850 µs"}, {12500 * time.Microsecond, "12.5 ms"},
		{1250 * time.Millisecond, "1.25 s"}, {125 * time.Second, "2m05s"}, {62 * time.Minute, "1h02m"},
	} {
		if got := Duration(c.d); got != c.want {
			t.Errorf("Duration(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
