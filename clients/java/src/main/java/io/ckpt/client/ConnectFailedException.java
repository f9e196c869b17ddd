package io.ckpt.client;

/**
 * ConnectFailedException: the agent's socket stayed missing or refusing
 * past the dial wait, or could not be opened at all (a permission denied).
 */
public class ConnectFailedException extends CkptException {
    private static final long serialVersionUID = 1L;

    public ConnectFailedException(String message, Throwable cause) {
        super(message, cause);
    }
}
