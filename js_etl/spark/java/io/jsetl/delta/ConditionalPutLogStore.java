package io.jsetl.delta;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import io.delta.storage.HadoopFileSystemLogStore;

/**
 * Delta's log store for S3 through Hadoop's S3A connector, safe with any number of writers:
 * a commit's log file is written with one PUT carrying {@code If-None-Match: *}, so the store
 * itself refuses a second writer of the same version, whichever process or library (deltalake
 * commits the same way). Delta's own {@code S3SingleDriverLogStore} checks for the file first and
 * then PUTs it unconditionally: safe only inside one JVM.
 *
 * <p>Relies on S3A 3.4.2+ (the {@code fs.option.create.conditional.overwrite} option of its
 * createFile builder) and on a store that honours {@code If-None-Match} (AWS S3 does). The
 * existence check S3A makes before a create is skipped ({@code fs.s3a.create.performance}): the
 * conditional PUT is the only check, so a refusal can only come from the store.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {

  public ConditionalPutLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite,
                    Configuration hadoopConf) throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
    if (!overwrite) {
      builder.must("fs.s3a.create.performance", true)
          .must("fs.option.create.conditional.overwrite", true);
    }
    FSDataOutputStream out = builder.build();
    try {
      while (actions.hasNext()) {
        out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
      }
      out.close();  // the PUT, and the store's answer to its condition, happen here
    } catch (IOException e) {
      if (!overwrite && preconditionFailed(e)) {
        throw new FileAlreadyExistsException(path.toString());
      }
      throw e;
    }
  }

  /** Whether the store refused the PUT because the file exists (HTTP 412). */
  private static boolean preconditionFailed(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof InterruptedIOException) {
        return false;
      }
      if (t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
          || t instanceof FileAlreadyExistsException
          || String.valueOf(t.getMessage()).contains("412")) {
        return true;
      }
    }
    return false;
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;  // a PUT is seen whole or not at all
  }
}
