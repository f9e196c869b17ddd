package io.ckpt.client;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;

/**
 * The conformance driver of the Java client (see clients/README.md): one
 * call per line on stdin, one answer per line on stdout. A call whose mode
 * is "async" goes through the client's CompletableFuture methods.
 */
public final class ConformanceDriver {
    private ConformanceDriver() {
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        Client c = null;
        String line;
        while ((line = in.readLine()) != null) {
            Map<String, Object> cmd = Json.object(Json.parse(line));
            String call = (String) cmd.get("call");
            Map<String, Object> res = new LinkedHashMap<>();
            try {
                switch (call) {
                    case "connect":
                        c = Client.connect(Path.of((String) cmd.get("socket")), Duration.ofMillis(num(cmd, "dial_wait_ms")));
                        res.put("ok", true);
                        break;
                    case "close":
                        if (c != null) {
                            c.close();
                        }
                        c = null;
                        res.put("ok", true);
                        break;
                    default:
                        res.put("event", call(c, call, cmd).fields());
                }
            } catch (AgentException e) {
                res.put("error", error("agent", e, e.code()));
            } catch (AbortedException e) {
                res.put("error", error("aborted", e, null));
            } catch (ConnectionLostException e) {
                res.put("error", error("connection", e, null));
            } catch (ConnectFailedException e) {
                res.put("error", error("connect", e, null));
            } catch (WaitTimeoutException e) {
                res.put("error", error("timeout", e, null));
            }
            out.println(Json.write(res));
        }
        if (c != null) {
            c.close();
        }
    }

    private static long num(Map<String, Object> cmd, String key) {
        Object v = cmd.get(key);
        return v instanceof Number ? ((Number) v).longValue() : 0;
    }

    private static Map<String, Object> error(String kind, Exception e, String code) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("kind", kind);
        m.put("code", code);
        m.put("message", e.getMessage());
        return m;
    }

    private static Event call(Client c, String call, Map<String, Object> cmd) throws CkptException {
        boolean async = "async".equals(cmd.get("mode"));
        String task = (String) cmd.get("task");
        long n = num(cmd, "checkpoint");
        switch (call) {
            case "hello":
                return async ? get(c.helloAsync()) : c.hello();
            case "checkpoint": {
                CheckpointOptions o = new CheckpointOptions().engine((String) cmd.get("engine"))
                        .handoff(Boolean.TRUE.equals(cmd.get("handoff")));
                if (num(cmd, "timeout_ms") > 0) {
                    o.timeout(Duration.ofMillis(num(cmd, "timeout_ms")));
                }
                if (num(cmd, "wait_ms") > 0) {
                    o.waitFor(Duration.ofMillis(num(cmd, "wait_ms")));
                }
                Path dir = Path.of((String) cmd.get("dir"));
                if (async && o.waitFor == null) {
                    return get(c.checkpointAsync(task, n, dir, o));
                }
                return c.checkpoint(task, n, dir, o);
            }
            case "restore":
                Path target = Path.of((String) cmd.get("target"));
                return async ? get(c.restoreAsync(task, target, n, false)) : c.restore(task, target, n);
            case "status":
                return async ? get(c.statusAsync(task)) : c.status(task);
            case "abort":
                return async ? get(c.abortAsync(task, n)) : c.abort(task, n);
            case "follow":
                return async ? get(c.followAsync(task)) : c.follow(task);
            default:
                throw new IllegalArgumentException("unknown call " + call);
        }
    }

    private static Event get(CompletableFuture<Event> f) throws CkptException {
        try {
            return f.get();
        } catch (InterruptedException e) {
            throw new CkptException("interrupted", e);
        } catch (ExecutionException e) {
            throw (CkptException) e.getCause();
        }
    }
}
