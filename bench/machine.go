package bench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Machine names the machine this process runs on, as far as a ratio of two
// implementations measured on it depends on it: the CPU's model, with its
// family and model numbers (one "model name" covers several generations
// of a server CPU, whose caches and ratios differ), the number of CPUs, and
// the operating system and architecture. A baseline whose Machine is not
// this one's was measured on other hardware, where the same code may give
// other ratios: a comparison with it says nothing about the code.
func Machine() string {
	cpu := runtime.GOARCH
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		fields := map[string]string{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				if len(fields) > 0 {
					break // the first processor's fields are enough
				}
				continue
			}
			k = strings.TrimSpace(k)
			if _, seen := fields[k]; !seen {
				fields[k] = strings.TrimSpace(v)
			}
		}
		if name := fields["model name"]; name != "" {
			cpu = name
			if fam, mod := fields["cpu family"], fields["model"]; fam != "" {
				cpu += fmt.Sprintf(" (family %s, model %s)", fam, mod)
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
}
