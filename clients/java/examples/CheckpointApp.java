import io.ckpt.client.AgentException;
import io.ckpt.client.CheckpointOptions;
import io.ckpt.client.Client;
import io.ckpt.client.Event;
import java.nio.file.Path;
import java.time.Duration;

/**
 * Checkpoints a store's snapshot through the agent and prints the outcome:
 *
 * <pre>
 * java -cp ckpt-client.jar CheckpointApp.java SOCKET TASK N DIR [ENGINE]
 * </pre>
 *
 * Prints the completed event as JSON; exits 1 with the agent's code on failure.
 */
public class CheckpointApp {
    public static void main(String[] args) throws Exception {
        Path socket = Path.of(args[0]);
        String task = args[1];
        long n = Long.parseLong(args[2]);
        Path dir = Path.of(args[3]);
        CheckpointOptions opts = new CheckpointOptions().timeout(Duration.ofMinutes(2))
                .onSynced(ev -> System.err.println("synced in " + ev.getLong("sync_ms") + " ms"));
        if (args.length > 4) {
            opts.engine(args[4]);
        }
        try (Client c = Client.connect(socket, Duration.ofSeconds(10))) {
            Event done = c.checkpoint(task, n, dir, opts);
            System.out.println(done);
        } catch (AgentException e) {
            System.err.println("checkpoint " + n + " of " + task + ": " + e.code() + ": " + e.agentMessage());
            System.exit(1);
        }
    }
}
