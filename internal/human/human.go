// Package human formats sizes, rates and durations the way an operator
// reads them, for tables, logs and the status page.
package human

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// ByteUnits are the binary units Bytes prints, smallest first.
var ByteUnits = []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}

// Bytes prints n in binary units with three significant digits:
// 512 B, 1.50 KiB, 12.3 MiB, 100 GiB.
func Bytes(n int64) string {
	if n < 1024 && n > -1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, unit := float64(n), 0
	for math.Abs(v) >= 1024 && unit < len(ByteUnits)-1 {
		v /= 1024
		unit++
	}
	return ThreeDigits(v) + " " + ByteUnits[unit]
}

// Rate prints a throughput in bytes per second.
func Rate(bytesPerSecond float64) string {
	if bytesPerSecond <= 0 || math.IsNaN(bytesPerSecond) || math.IsInf(bytesPerSecond, 0) {
		return "0 B/s"
	}
	return Bytes(int64(bytesPerSecond)) + "/s"
}

// Duration prints d the way an operator reads it: 850 µs, 12.5 ms,
// 1.25 s, 2m05s, 1h02m.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + " µs"
	case d < time.Second:
		return ThreeDigits(float64(d)/float64(time.Millisecond)) + " ms"
	case d < time.Minute:
		return ThreeDigits(d.Seconds()) + " s"
	case d < time.Hour:
		s := int64(d.Round(time.Second) / time.Second)
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	default:
		m := int64(d.Round(time.Minute) / time.Minute)
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	}
}

// ThreeDigits prints v with three significant digits (two decimals below 10).
func ThreeDigits(v float64) string {
	a := math.Abs(v)
	switch {
	case a < 9.995:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a < 99.95:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}
