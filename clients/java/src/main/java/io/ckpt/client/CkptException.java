package io.ckpt.client;

import java.io.IOException;

/** CkptException is the base of every error the client throws. */
public class CkptException extends IOException {
    private static final long serialVersionUID = 1L;

    public CkptException(String message) {
        super(message);
    }

    public CkptException(String message, Throwable cause) {
        super(message, cause);
    }
}
