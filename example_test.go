package streamlimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/httplimit"
)

// The README's "In a Go service", run: a service at site eu-1 whose rules allow user 42
// two requests a minute. With Brokers set, the global limits of the rules are shared with
// every other site through Kafka; without, this process counts them alone.
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	defer inTempDir(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`)()

	lim, err := streamlimit.New(streamlimit.Config{
		Site:  "eu-1",
		Rules: "rules.yaml", // reloaded when it changes
	})
	if err != nil {
		log.Fatal(err)
	}
	go lim.Run(ctx)                       // rules, counts topic, idle counters
	defer lim.Close(context.Background()) // last hits, then "this site left"

	for range 3 {
		if lim.Allow(ctx, "api", "user", "42") {
			fmt.Println("admitted")
		} else {
			fmt.Println("429") // one descriptor, user=42, in domain api
		}
	}
	// Output:
	// admitted
	// admitted
	// 429
}

// inTempDir makes a temporary directory holding rules.yaml the working directory, and
// returns what undoes it.
func inTempDir(rulesYAML string) func() {
	dir, err := os.MkdirTemp("", "streamlimit-example")
	if err != nil {
		log.Fatal(err)
	}
	wd, _ := os.Getwd()
	if err := os.WriteFile(dir+"/rules.yaml", []byte(rulesYAML), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		log.Fatal(err)
	}
	return func() {
		_ = os.Chdir(wd)
		_ = os.RemoveAll(dir)
	}
}

// net/http middleware on the same Limiter: each request's descriptor is its X-User header,
// decided in domain api; a refused request is answered 429 with the rate-limit header
// fields and never reaches the handler (docs/api.md, "In a Go service").
func ExampleLimiter_Middleware() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	defer inTempDir(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`)()
	lim, err := streamlimit.New(streamlimit.Config{Site: "eu-1", Rules: "rules.yaml"})
	if err != nil {
		log.Fatal(err)
	}
	go lim.Run(ctx)
	defer lim.Close(context.Background())

	mw, err := lim.Middleware(httplimit.Config{
		Domain: "api",
		Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{
			{Type: httplimit.SourceHeader, Name: "X-User", Key: "user"},
		}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	srv := httptest.NewServer(mw.Handler(app))
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-User", "42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	// Output:
	// 200
	// 200
	// 429
}
