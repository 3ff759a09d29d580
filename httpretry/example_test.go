package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/httpretry"
)

// A server refuses the first request with 429 and Retry-After: 0 (come
// back at once); the client retries on that hint and gets the answer.
func ExampleNewClient() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "hello")
	}))
	defer api.Close()

	client := httpretry.NewClient(httpretry.Config{
		HintJitter: -1, // wait exactly the hint, for this example's output
		OnWait: func(e httpretry.Event) {
			fmt.Printf("attempt %d after a %d: wait %v (%v)\n", e.Attempt, e.Status, e.Wait, e.Source)
		},
	})
	resp, err := client.Get(api.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s", resp.StatusCode, body)
	// Output:
	// attempt 2 after a 429: wait 0s (Retry-After)
	// 200 hello
}

// A server asks for two minutes; the request has five seconds. The client
// fails at once with the server's word instead of sleeping in vain.
func ExampleError_deadline() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer api.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
	_, err := httpretry.NewClient(httpretry.Config{}).Do(req)

	var e *httpretry.Error
	if errors.As(err, &e) && errors.Is(err, httpretry.ErrDeadline) {
		fmt.Printf("gave up after %d attempt: %d, %v asks for %v\n", e.Attempts, e.Status, e.Source, e.Wait)
	}
	// Output:
	// gave up after 1 attempt: 503, Retry-After asks for 2m0s
}
