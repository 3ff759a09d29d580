package simulate

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"time"
)

// WriteSVG draws s as an SVG image: one chart per rule, stacked bars of
// what it allowed (green), denied (red) and let through in shadow mode
// (orange) in each slice of time, on a shared time axis, with the totals
// in each chart's title. It needs nothing but a browser to view.
func WriteSVG(w io.Writer, s *Summary) error {
	const (
		width    = 900
		left     = 60
		right    = 20
		chartH   = 140
		gap      = 50
		top      = 40
		barSpace = width - left - right
		labelH   = 14 // the band at the top of a chart where the windows' names go, above every bar
	)
	bw := bufio.NewWriter(w)
	height := top + len(s.Rules)*(chartH+gap) + 10
	if len(s.Rules) == 0 {
		height = top + 40
	}
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(bw, `<text x="%d" y="20" font-size="14" font-weight="bold">%d requests: %d allowed, %d denied; every bar is %s from %s</text>`+"\n",
		left, s.Requests, s.Allowed, s.Denied, s.Step, html.EscapeString(s.Start.UTC().Format(time.RFC3339)))
	if len(s.Rules) == 0 {
		fmt.Fprintf(bw, `<text x="%d" y="%d">no rule matched a request</text>`+"\n", left, top+20)
	}
	barW := float64(barSpace) / float64(max(s.Steps, 1))
	for ri, r := range s.Rules {
		y0 := top + ri*(chartH+gap) + 20
		var peak int64 = 1
		for i := range r.AllowedOver {
			peak = max(peak, r.AllowedOver[i]+r.DeniedOver[i]+r.ShadowDeniedOver[i])
		}
		fmt.Fprintf(bw, `<g class="rule" data-rule="%s">`+"\n", html.EscapeString(r.StatKey))
		fmt.Fprintf(bw, `<text x="%d" y="%d" font-weight="bold">%s: %d allowed, %d denied, %d shadow-denied</text>`+"\n",
			left, y0-6, html.EscapeString(r.StatKey), r.Allowed, r.Denied, r.ShadowDenied)
		fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`+"\n", left, y0+chartH, width-right, y0+chartH)
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="end">%d</text>`+"\n", left-6, y0+labelH+10, peak)
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="end">0</text>`+"\n", left-6, y0+chartH)
		windows(bw, r.WindowOver, float64(left), barW, y0, chartH, s.Step)
		for i := range r.AllowedOver {
			x := float64(left) + float64(i)*barW
			base := float64(y0 + chartH)
			for _, part := range []struct {
				n     int64
				color string
				kind  string
			}{{r.AllowedOver[i], "#2e7d32", "allowed"}, {r.DeniedOver[i], "#c62828", "denied"}, {r.ShadowDeniedOver[i], "#ef6c00", "shadow-denied"}} {
				if part.n == 0 {
					continue
				}
				h := float64(chartH-labelH) * float64(part.n) / float64(peak)
				base -= h
				fmt.Fprintf(bw, `<rect class="%s" x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s" data-n="%d"><title>%s, +%s: %d %s</title></rect>`+"\n",
					part.kind, x, base, max(barW-1, 0.5), h, part.color, part.n,
					html.EscapeString(r.StatKey), time.Duration(i)*s.Step, part.n, part.kind)
			}
		}
		fmt.Fprintf(bw, `<text x="%d" y="%d">+0s</text>`+"\n", left, y0+chartH+16)
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="end">+%s</text>`+"\n", width-right, y0+chartH+16, time.Duration(s.Steps)*s.Step)
		bw.WriteString("</g>\n")
	}
	bw.WriteString(`<g font-size="11"><rect x="600" y="8" width="10" height="10" fill="#2e7d32"/><text x="614" y="17">allowed</text>` +
		`<rect x="670" y="8" width="10" height="10" fill="#c62828"/><text x="684" y="17">denied</text>` +
		`<rect x="735" y="8" width="10" height="10" fill="#ef6c00"/><text x="749" y="17">shadow-denied</text></g>` + "\n")
	bw.WriteString("</svg>\n")
	return bw.Flush()
}

// windows shades the runs of steps in which a window of the rule's
// schedules applied, each with the window's name in the band at the top
// of the chart, which no bar reaches.
func windows(bw *bufio.Writer, over []string, left, barW float64, y0, chartH int, step time.Duration) {
	for i := 0; i < len(over); {
		j := i + 1
		for j < len(over) && over[j] == over[i] {
			j++
		}
		if name := over[i]; name != "" {
			x := left + float64(i)*barW
			fmt.Fprintf(bw, `<rect class="window" x="%.2f" y="%d" width="%.2f" height="%d" fill="#1565c0" fill-opacity="0.08" data-window="%s"><title>schedule %s, +%s to +%s</title></rect>`+"\n",
				x, y0, float64(j-i)*barW, chartH, html.EscapeString(name), html.EscapeString(name), time.Duration(i)*step, time.Duration(j)*step)
			fmt.Fprintf(bw, `<text class="window-name" x="%.2f" y="%d" font-size="10" fill="#1565c0">%s</text>`+"\n", x+2, y0+11, html.EscapeString(name))
		}
		i = j
	}
}
