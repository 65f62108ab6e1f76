package idem

// clients/conformance.json, the answers every library gives the same: each
// decision row's HTTP answer, each SQLSTATE's kind, each header pair a
// handler may return.  (Its hostile rows run end to end against the
// middleware: examples/python/test_payments_service.py.)  No database
// needed.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

type fixture struct {
	NestingLimit int `json:"nesting_limit"`
	Decisions    struct {
		Rows []struct {
			Name string
			Row  struct {
				Outcome    string
				HTTPStatus *int32          `json:"http_status"`
				Headers    json.RawMessage `json:"headers"`
				BodyText   *string         `json:"body_text"`
				ErrorCode  *string         `json:"error_code"`
				RetryAfter *int32          `json:"retry_after"`
				RawBodyHex *string         `json:"raw_body_hex"`
			}
			Status   int
			Headers  [][2]string
			BodyHex  *string `json:"body_hex"`
			BodyText *string `json:"body_text"`
		}
	}
	Sqlstates struct {
		Codes map[string]string
	}
	HeaderValues struct {
		Rows []struct {
			Name, Value string
			Valid       bool
		}
	} `json:"header_values"`
}

func readFixture(t *testing.T) fixture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "conformance.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestConformanceDecisions(t *testing.T) {
	for _, row := range readFixture(t).Decisions.Rows {
		d := decision{Outcome: row.Row.Outcome, HTTPStatus: row.Row.HTTPStatus, ErrorCode: row.Row.ErrorCode,
			RetryAfter: row.Row.RetryAfter, Body: row.Row.BodyText}
		if len(row.Row.Headers) > 0 && string(row.Row.Headers) != "null" {
			h := string(row.Row.Headers)
			d.Headers = &h
		}
		if row.Row.RawBodyHex != nil {
			d.RawBody, _ = hex.DecodeString(*row.Row.RawBodyHex)
			if d.RawBody == nil {
				d.RawBody = []byte{}
			}
		}
		r, err := answer(&d)
		var body []byte
		if row.BodyHex != nil {
			body, _ = hex.DecodeString(*row.BodyHex)
		} else {
			body = []byte(*row.BodyText)
		}
		headers := r.Headers
		if headers == nil {
			headers = [][2]string{}
		}
		if err != nil || r.Status != row.Status || !reflect.DeepEqual(headers, row.Headers) || !bytes.Equal(r.Body, body) {
			t.Errorf("%s: %d %v %q %v", row.Name, r.Status, r.Headers, r.Body, err)
		}
	}
}

type stateError string

func (e stateError) Error() string    { return "refused" }
func (e stateError) SQLState() string { return string(e) }

func TestConformanceSQLStates(t *testing.T) {
	kinds := map[string]string{"IDEMPOTENCY_KEY_INVALID": "key_invalid", "INVALID_REQUEST": "request_invalid"}
	codes := readFixture(t).Sqlstates.Codes
	states := make([]string, 0, len(codes))
	for s := range codes {
		states = append(states, s)
	}
	sort.Strings(states)
	for _, state := range states {
		got := "error"
		if r := refuse(fmt.Errorf("wrapped: %w", stateError(state))); r != nil {
			got = kinds[code(*r)]
		}
		if got != codes[state] {
			t.Errorf("SQLSTATE %s: %s, want %s", state, got, codes[state])
		}
	}
}

func TestConformanceHeaderValues(t *testing.T) {
	for _, row := range readFixture(t).HeaderValues.Rows {
		pair := [2]string{row.Name, row.Value}
		_, args, err := (calls{}).finish("token", Result{Status: 200, Headers: [][2]string{pair}})
		stored := err == nil
		if stored {
			var back [][2]string
			json.Unmarshal([]byte(args[2].(string)), &back)
			stored = reflect.DeepEqual(back, [][2]string{pair})
		}
		if stored != row.Valid {
			t.Errorf("header %q: stored %v, want %v (%v)", pair, stored, row.Valid, err)
		}
	}
}

func TestConformanceNesting(t *testing.T) {
	limit := readFixture(t).NestingLimit
	if MaxNesting != limit {
		t.Fatalf("MaxNesting %d, the fixture's %d", MaxNesting, limit)
	}
	at := func(n int) []byte {
		return []byte(string(bytes.Repeat([]byte("["), n)) + `"[{\"["` + string(bytes.Repeat([]byte("]"), n)))
	}
	if TooDeep(at(limit), limit) || !TooDeep(at(limit+1), limit) {
		t.Fatal("TooDeep")
	}
}
