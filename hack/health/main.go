// Command health reads Kubernetes objects as JSON, one per line on stdin, and prints for each
// how the CD tools judge it, computed by their own code: kstatus (sigs.k8s.io/cli-utils, what
// Flux's health checks and `kubectl`-style waits in CD tools use) and Argo CD's custom health
// check for the kind, a Lua script given as the first argument, run by gopher-lua as Argo CD
// runs it (the object as the global `obj`, the script returns {status, message}).
//
// Output: one JSON line per object: {"kstatus": ..., "kstatusMessage": ..., "argo": ...,
// "argoMessage": ...}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Kstatus        string `json:"kstatus"`
	KstatusMessage string `json:"kstatusMessage"`
	Argo           string `json:"argo,omitempty"`
	ArgoMessage    string `json:"argoMessage,omitempty"`
}

func main() {
	script := ""
	if len(os.Args) > 1 {
		raw, err := os.ReadFile(os.Args[1])
		if err != nil {
			fail(err)
		}
		script = string(raw)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		// Decoded as the API machinery decodes objects (integers as int64), which kstatus expects.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(in.Bytes()); err != nil {
			fail(err)
		}
		v, err := judge(u.Object, script)
		if err != nil {
			fail(err)
		}
		if err := out.Encode(v); err != nil {
			fail(err)
		}
	}
	if err := in.Err(); err != nil {
		fail(err)
	}
}

func judge(obj map[string]interface{}, script string) (verdict, error) {
	result, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		return verdict{}, fmt.Errorf("kstatus: %w", err)
	}
	v := verdict{Kstatus: result.Status.String(), KstatusMessage: result.Message}
	if script == "" {
		return v, nil
	}
	v.Argo, v.ArgoMessage, err = argoHealth(obj, script)
	return v, err
}

// argoHealth runs the health script as Argo CD does: a fresh VM, `obj` set, the returned
// table's status and message.
func argoHealth(obj map[string]interface{}, script string) (string, string, error) {
	vm := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer vm.Close()
	vm.SetGlobal("obj", toLua(vm, obj))
	if err := vm.DoString(script); err != nil {
		return "", "", fmt.Errorf("argo health script: %w", err)
	}
	table, ok := vm.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("argo health script returned %s, not a table", vm.Get(-1).Type())
	}
	return lua.LVAsString(table.RawGetString("status")), lua.LVAsString(table.RawGetString("message")), nil
}

// toLua converts decoded JSON into Lua values: objects and arrays become tables (arrays
// indexed from 1), null becomes nil.
func toLua(vm *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case map[string]interface{}:
		t := vm.NewTable()
		for key, item := range v {
			t.RawSetString(key, toLua(vm, item))
		}
		return t
	case []interface{}:
		t := vm.NewTable()
		for _, item := range v {
			t.Append(toLua(vm, item))
		}
		return t
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	default:
		return lua.LNil
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "health:", err)
	os.Exit(1)
}
